/**
 * HTTP and WebSocket plumbing the fake servers share: JSON in and out, listening on 127.0.0.1,
 * shutting down, and waiting for the fake's state to reach a condition.
 */
import type {IncomingMessage, Server, ServerResponse} from 'node:http'
import type {AddressInfo} from 'node:net'
import type {WebSocket, WebSocketServer} from 'ws'

/** Sends `body` as JSON, or only the status when there is no body (e.g. 204). */
export function sendJson(
  res: ServerResponse,
  status: number,
  body?: unknown,
  headers: Record<string, string> = {},
): void {
  if (res.destroyed) return // the client hung up: there is no one to answer
  if (body === undefined) {
    res.writeHead(status, headers)
    res.end()
    return
  }
  res.writeHead(status, {'content-type': 'application/json', ...headers})
  res.end(JSON.stringify(body))
}

export async function readRaw(req: IncomingMessage): Promise<Buffer> {
  const chunks: Buffer[] = []
  for await (const chunk of req) chunks.push(chunk as Buffer)
  return Buffer.concat(chunks)
}

export async function readBody(req: IncomingMessage): Promise<string> {
  return (await readRaw(req)).toString('utf8')
}

/** The parsed JSON body, or undefined when it is not JSON (the fake answers that like the real API). */
export async function readJson(req: IncomingMessage): Promise<any> {
  const body = await readBody(req)
  try {
    return JSON.parse(body)
  } catch {
    return undefined
  }
}

/** Listens on 127.0.0.1 (a free port unless one is given) and returns the port. */
export async function listenOnLoopback(server: Server, port = 0): Promise<number> {
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject)
    server.listen(port, '127.0.0.1', () => resolve())
  })
  return (server.address() as AddressInfo).port
}

/** Cuts the fake's WebSockets without a close handshake, then closes the server and its keep-alive connections. */
export async function closeFakeServer(
  server: Server,
  websockets?: {wss: WebSocketServer; sockets: Iterable<WebSocket>},
): Promise<void> {
  if (websockets) {
    for (const socket of websockets.sockets) socket.terminate()
    websockets.wss.close()
  }
  server.closeAllConnections()
  await new Promise<void>((resolve) => server.close(() => resolve()))
}

export interface Waiters {
  /** Call after every change of the fake's state: re-checks every pending wait. */
  notify(): void
  /** Resolves once `check()` holds; rejects after `timeoutMs` with `LABEL: timed out waiting for WHAT`. */
  waitFor(check: () => boolean, timeoutMs: number, what: string | (() => string)): Promise<void>
}

/** Waits on a fake's state without polling: the fake calls `notify()` whenever something happens. */
export function createWaiters(label: string): Waiters {
  const waiters = new Set<() => void>()
  return {
    notify() {
      for (const waiter of waiters) waiter()
    },
    waitFor(check, timeoutMs, what) {
      if (check()) return Promise.resolve()
      return new Promise((resolve, reject) => {
        const waiter = () => {
          if (!check()) return
          waiters.delete(waiter)
          clearTimeout(timer)
          resolve()
        }
        const timer = setTimeout(() => {
          waiters.delete(waiter)
          reject(new Error(`${label}: timed out waiting for ${typeof what === 'string' ? what : what()}`))
        }, timeoutMs)
        waiters.add(waiter)
      })
    },
  }
}

/** How a fake answers a reply post it does not take. */
export interface PostFailure {
  status: number
  /** Sent as Retry-After (seconds). */
  retryAfterSeconds?: number
  /** Fail this many posts, then take them again; unset: until cleared. */
  times?: number
  /** Only posts to this channel fail. */
  channelId?: string
  /** Take this many posts first (the first chunks of a reply), then fail. */
  afterTaken?: number
}

/** The platform's own rate limit: more than `max` posts within `perMs` get a 429 with Retry-After. */
export interface PostRateLimit {
  max: number
  perMs: number
  retryAfterSeconds: number
}

export interface PostFaults {
  /** Answer reply posts with this failure (undefined clears it). */
  failPosts(failure: PostFailure | undefined): void
  limitPosts(limit: PostRateLimit | undefined): void
  /** Every post attempt, taken or not, in order. */
  readonly attempts: Array<{time: number; status: number}>
  /** Called by the fake for each post: the failure to answer with, or undefined to take the post. */
  next(channelId: string): PostFailure | undefined
}

/** Scripted failures and a rate limit for a fake's reply endpoint. */
export function createPostFaults(notify: () => void): PostFaults {
  let failure: PostFailure | undefined
  let limit: PostRateLimit | undefined
  const attempts: Array<{time: number; status: number}> = []
  let takenSinceFailureSet = 0
  return {
    attempts,
    failPosts(next) {
      failure = next && {...next}
      takenSinceFailureSet = 0
    },
    limitPosts(next) {
      limit = next
    },
    next(channelId) {
      const now = Date.now()
      let answer: PostFailure | undefined
      const applies =
        failure &&
        (failure.channelId === undefined || failure.channelId === channelId) &&
        takenSinceFailureSet >= (failure.afterTaken ?? 0)
      if (failure && applies) {
        answer = failure
        if (failure.times !== undefined && --failure.times <= 0) failure = undefined
      } else if (limit) {
        const taken = attempts.filter((attempt) => attempt.status < 300 && now - attempt.time < limit!.perMs).length
        if (taken >= limit.max) answer = {status: 429, retryAfterSeconds: limit.retryAfterSeconds}
      }
      if (!answer) takenSinceFailureSet++
      attempts.push({time: now, status: answer?.status ?? 200})
      notify()
      return answer
    },
  }
}

/**
 * Takes a fake off the network and back on the same port: while off, connections are refused
 * (the platform is unreachable) and its WebSockets are cut.
 */
export function createOutage(
  server: Server,
  port: () => number,
  sockets: Iterable<WebSocket>,
): {goOffline(): Promise<void>; comeBack(): Promise<void>} {
  return {
    async goOffline() {
      for (const socket of sockets) socket.terminate()
      server.closeAllConnections()
      await new Promise<void>((resolve) => server.close(() => resolve()))
    },
    async comeBack() {
      await listenOnLoopback(server, port())
    },
  }
}

/** What every platform fake offers to break its replies: scripted failures, a rate limit, an outage. */
export interface PlatformFaults {
  /** Scripted failures and a rate limit for the bot's reply posts. */
  readonly faults: PostFaults
  /** Refuses every connection (and cuts the open ones) until comeBack(). */
  goOffline(): Promise<void>
  comeBack(): Promise<void>
}

export function createFaults(
  server: Server,
  port: () => number,
  sockets: Iterable<WebSocket>,
  notify: () => void,
): PlatformFaults {
  return {faults: createPostFaults(notify), ...createOutage(server, port, sockets)}
}
