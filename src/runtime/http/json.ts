import type {IncomingMessage, ServerResponse} from 'node:http'
import {HttpError} from './router.js'

/** The largest request body any route reads; a larger one is refused on every route. */
export const MAX_BODY_BYTES = 1024 * 1024
/** Deeper bodies are refused: nothing the gateway accepts nests this far, and recursion over them could overflow. */
const MAX_JSON_DEPTH = 32

export function sendJson(
  res: ServerResponse,
  status: number,
  body: unknown,
  headers: Record<string, string> = {},
): void {
  const text = JSON.stringify(body)
  res.writeHead(status, {
    'content-type': 'application/json; charset=utf-8',
    'content-length': String(Buffer.byteLength(text)),
    'cache-control': 'no-store',
    ...headers,
  })
  res.end(text)
}

export function sendError(res: ServerResponse, error: HttpError): void {
  sendJson(res, error.status, {error: {code: error.code, message: error.message}}, error.headers)
}

/** What reading a request's body needs: the request, and its response for `100 Continue`. */
export interface BodyExchange {
  req: IncomingMessage
  res: ServerResponse
}

/**
 * The request body parsed as a JSON object; a clear 400/413/415 otherwise. Only
 * `Content-Type: application/json` is read: a cross-site form or a body without a type (which a
 * browser sends without asking the server first) is refused before anything is parsed.
 */
export async function readJsonObject(
  {req, res}: BodyExchange,
  limit = MAX_BODY_BYTES,
): Promise<Record<string, unknown>> {
  const type = req.headers['content-type'] ?? ''
  if (!/^application\/json\s*(;|$)/i.test(type)) {
    throw new HttpError(415, 'E_INPUT', 'send the body as JSON with Content-Type: application/json')
  }
  const body = await readBody({req, res}, limit)
  let parsed: unknown
  try {
    parsed = JSON.parse(body.toString('utf8'))
  } catch {
    throw new HttpError(400, 'E_INPUT', 'the request body is not valid JSON')
  }
  if (!parsed || typeof parsed !== 'object' || Array.isArray(parsed)) {
    throw new HttpError(400, 'E_INPUT', 'the request body must be a JSON object')
  }
  if (jsonDepth(parsed) > MAX_JSON_DEPTH)
    throw new HttpError(400, 'E_INPUT', `the request body nests deeper than ${MAX_JSON_DEPTH} levels`)
  return parsed as Record<string, unknown>
}

/**
 * A 413 that closes the connection: the rest of the body is not read, so the connection cannot
 * carry another request (the server lingers on it so that the client still reads the answer).
 */
export function bodyTooLarge(limit: number): HttpError {
  return new HttpError(413, 'E_INPUT', `the request body is larger than ${limit} bytes; send at most ${limit} bytes`, {
    connection: 'close',
  })
}

/**
 * The whole body, at most `limit` bytes. A declared larger one is refused before a byte of it is
 * asked for (a client waiting on `Expect: 100-continue` gets the 413 instead of `100 Continue`);
 * one that grows past the limit is refused there, and what still arrives is discarded.
 */
async function readBody({req, res}: BodyExchange, limit: number): Promise<Buffer> {
  if (Number(req.headers['content-length']) > limit) throw bodyTooLarge(limit)
  if (/^100-continue$/i.test(req.headers.expect ?? '') && !res.headersSent) res.writeContinue()
  return new Promise<Buffer>((resolve, reject) => {
    const chunks: Buffer[] = []
    let size = 0
    const stop = () => {
      req.off('data', onData)
      req.off('end', onEnd)
      req.off('close', onClose)
    }
    const onData = (chunk: Buffer) => {
      size += chunk.length
      if (size <= limit) {
        chunks.push(chunk)
        return
      }
      stop()
      req.resume() // dropped, not destroyed: destroying the request resets the connection before the 413 is sent
      reject(bodyTooLarge(limit))
    }
    const onEnd = () => {
      stop()
      resolve(Buffer.concat(chunks))
    }
    const onClose = () => {
      stop()
      reject(new Error('the client went away before the request body arrived whole'))
    }
    req.on('data', onData)
    req.on('end', onEnd)
    req.on('close', onClose)
    req.on('error', () => {}) // an aborted upload: 'close' answers it
  })
}

/** Nesting depth of parsed JSON, without recursion (so a deep body cannot overflow the stack). */
export function jsonDepth(value: unknown): number {
  let deepest = 0
  const stack: Array<[unknown, number]> = [[value, 1]]
  while (stack.length > 0) {
    const [item, depth] = stack.pop() as [unknown, number]
    if (!item || typeof item !== 'object') continue
    deepest = Math.max(deepest, depth)
    if (deepest > MAX_JSON_DEPTH) return deepest
    for (const child of Object.values(item)) stack.push([child, depth + 1])
  }
  return deepest
}

/** The token of an `Authorization: Bearer <token>` header, if any. */
export function bearerToken(req: IncomingMessage): string | undefined {
  const header = req.headers.authorization
  const match = header ? /^Bearer\s+(\S+)\s*$/i.exec(header) : null
  return match ? match[1] : undefined
}
