/**
 * Files a fake platform serves to the bot (attachments): each at a path, with the behaviour a
 * test scripts (a lying Content-Length, an endless body, a redirect, a slow start), and every
 * download the bot made, with its Authorization header.
 */
import type {IncomingMessage, ServerResponse} from 'node:http'

export interface FakeFile {
  body?: Buffer
  contentType?: string
  /** Sent as Content-Length instead of the body's own (a lie). */
  contentLength?: number
  /** Never ends: 64 KiB chunks for as long as the client reads. */
  endless?: boolean
  /** Answers 302 to this location. */
  redirect?: string
  /** Answers this status with a short text body. */
  status?: number
  /** Waits this long before the headers. */
  delayMs?: number
}

export interface FakeFiles {
  add(path: string, file: FakeFile): void
  readonly downloads: Array<{path: string; authorization?: string}>
  /** Answers the request when it is for a file added here; false otherwise. */
  serve(req: IncomingMessage, res: ServerResponse, authorized: boolean): boolean
}

export function createFakeFiles(): FakeFiles {
  const files = new Map<string, FakeFile>()
  const downloads: FakeFiles['downloads'] = []
  return {
    add: (path, file) => files.set(path, file),
    downloads,
    serve(req, res, authorized) {
      const path = new URL(req.url ?? '/', 'http://fake').pathname
      const file = files.get(path)
      if (req.method !== 'GET' || !file) return false
      downloads.push({path, ...(req.headers.authorization ? {authorization: req.headers.authorization} : {})})
      const answer = () => {
        if (res.destroyed) return
        if (!authorized) return void res.writeHead(401, {'content-type': 'text/plain'}).end('unauthorized')
        if (file.redirect) return void res.writeHead(302, {location: file.redirect}).end()
        if (file.status) return void res.writeHead(file.status, {'content-type': 'text/plain'}).end('scripted')
        const headers: Record<string, string | number> = {
          'content-type': file.contentType ?? 'application/octet-stream',
        }
        if (file.endless) {
          res.writeHead(200, headers)
          const chunk = Buffer.alloc(64 * 1024, 0x61)
          const pump = () => {
            while (!res.destroyed && res.write(chunk));
            if (!res.destroyed) res.once('drain', pump)
          }
          pump()
          return
        }
        const body = file.body ?? Buffer.alloc(0)
        headers['content-length'] = file.contentLength ?? body.length
        res.writeHead(200, headers)
        if (file.contentLength !== undefined && file.contentLength < body.length) {
          res.write(body) // more than declared: the socket carries it anyway
          res.socket?.end()
          return
        }
        res.end(body)
      }
      if (file.delayMs) setTimeout(answer, file.delayMs)
      else answer()
      return true
    },
  }
}
