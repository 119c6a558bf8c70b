import type {IncomingMessage, ServerResponse} from 'node:http'
import {HttpError} from '../http/router.js'

export interface EventStream {
  send(event: string, data: unknown, id?: number): void
  close(): void
  /** Resolves when the client goes away or close() is called. */
  readonly closed: Promise<void>
}

/**
 * A Server-Sent Events response. A comment every 15 s keeps proxies from closing an idle
 * stream while a long build step prints nothing.
 */
export function openEventStream(req: IncomingMessage, res: ServerResponse): EventStream {
  res.writeHead(200, {
    'content-type': 'text/event-stream; charset=utf-8',
    'cache-control': 'no-store',
    connection: 'keep-alive',
    'x-accel-buffering': 'no',
  })
  res.flushHeaders()
  let finished = false
  let resolveClosed!: () => void
  const closed = new Promise<void>((resolve) => (resolveClosed = resolve))
  const heartbeat = setInterval(() => res.write(': keep-alive\n\n'), 15_000)
  const finish = () => {
    if (finished) return
    finished = true
    clearInterval(heartbeat)
    resolveClosed()
  }
  req.on('close', finish)
  res.on('close', finish)
  return {
    send(event, data, id) {
      if (finished) return
      const lines = JSON.stringify(data)
      res.write(`${id === undefined ? '' : `id: ${id}\n`}event: ${event}\ndata: ${lines}\n\n`)
    },
    close() {
      if (!finished) res.end()
      finish()
    },
    closed,
  }
}

/** The id of the last event a reconnecting EventSource saw (Last-Event-ID header or ?after=). */
export function lastEventId(req: IncomingMessage, url: URL): number {
  const raw = req.headers['last-event-id'] ?? url.searchParams.get('after') ?? ''
  const value = Number(Array.isArray(raw) ? raw[0] : raw)
  return Number.isInteger(value) && value >= 0 ? value : 0
}

/** Event streams one principal may hold open at once (a browser tab needs one). */
export const MAX_STREAMS_PER_PRINCIPAL = 4

/** Opens event streams, at most `max` per principal at a time; the next one answers 429. */
export class StreamLimiter {
  private readonly counts = new Map<string, number>()

  constructor(private readonly max: number) {}

  open(principal: string, req: IncomingMessage, res: ServerResponse): EventStream {
    const count = this.counts.get(principal) ?? 0
    if (count >= this.max) {
      throw new HttpError(
        429,
        'E_BUSY',
        `at most ${this.max} event streams may be open at once per session or key; close one first`,
        {'retry-after': '5'},
      )
    }
    this.counts.set(principal, count + 1)
    const stream = openEventStream(req, res)
    void stream.closed.then(() => {
      const left = (this.counts.get(principal) ?? 1) - 1
      if (left > 0) this.counts.set(principal, left)
      else this.counts.delete(principal)
    })
    return stream
  }
}
