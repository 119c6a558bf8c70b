import http from 'node:http'
import https from 'node:https'
import net from 'node:net'
import {Readable} from 'node:stream'
import tls from 'node:tls'
import zlib from 'node:zlib'
import type {ProviderConfig} from '../config/types.js'
import {requestTimeoutMs} from './retry.js'

/**
 * What every SDK client gets: no retries of its own (retry.ts owns them, so backoff and fallback
 * follow one policy for every provider), this fetch, and a timeout that is only a backstop (each
 * attempt is aborted at timeout_seconds, with an error that says so). Here, not in retry.ts: only
 * the SDKs' modules (loaded lazily) import this one, so a start loads node:http, node:https and
 * node:zlib (≈ 4 ms) when a provider client is built, not before agent-run is started.
 */
export function sdkClientOptions(config: ProviderConfig): {maxRetries: 0; fetch: typeof httpFetch; timeout: number} {
  return {maxRetries: 0, fetch: httpFetch, timeout: requestTimeoutMs(config) + 1_000}
}

/**
 * The `fetch` both provider SDKs are given: the fetch API over node:http. Node 20's global fetch
 * (undici) compiles its HTTP parser to WebAssembly on first use, and at exit the process waits for
 * the optimising tier of that compile: ~70 ms and a busy core added to every agent-run.
 *
 * Covers what the SDKs use: string/bytes/stream bodies, AbortSignal (rejecting with an AbortError,
 * which they read as a timeout or a cancel), streamed responses, gzip/deflate/br. Redirects are
 * returned, not followed: no LLM API redirects, and following one would resend the API key.
 */
export async function httpFetch(
  input: string | URL | Request,
  init: RequestInit & {
    /** Another connection pool (e.g. one that accepts any TLS certificate); a pool kept per protocol by default. */
    agent?: http.Agent
  } = {},
): Promise<Response> {
  if (typeof input !== 'string' && !(input instanceof URL)) throw new TypeError('httpFetch takes a URL, not a Request')
  const url = new URL(input)
  if (url.protocol !== 'http:' && url.protocol !== 'https:')
    throw new TypeError(`httpFetch cannot fetch ${url.protocol} URLs`)
  const signal = init.signal ?? undefined
  if (signal?.aborted) throw abortError(signal)

  const headers = new Headers(init.headers)
  if (!headers.has('accept-encoding')) headers.set('accept-encoding', 'gzip, deflate, br')
  const body = await requestBody(init.body)
  if (typeof body === 'string' || body instanceof Uint8Array)
    headers.set('content-length', String(Buffer.byteLength(body)))

  const requestHeaders: Record<string, string> = {}
  headers.forEach((value, name) => {
    requestHeaders[name] = value
  })
  return new Promise<Response>((resolve, reject) => {
    const request = (url.protocol === 'https:' ? https : http).request(url, {
      method: init.method ?? 'GET',
      headers: requestHeaders,
      agent: init.agent ?? agents[url.protocol as 'http:' | 'https:'],
    })
    let response: http.IncomingMessage | undefined
    // The body stream must fail with the AbortError itself, or a reader sees a plain "aborted" reset.
    const onAbort = () => {
      const error = abortError(signal)
      response?.destroy(error)
      request.destroy(error)
    }
    signal?.addEventListener('abort', onAbort, {once: true})
    const done = () => signal?.removeEventListener('abort', onAbort)
    request.on('error', (error) => {
      done()
      reject(error)
    })
    request.on('response', (incoming) => {
      response = incoming
      response.on('close', done)
      const status = response.statusCode ?? 0
      const responseHeaders = new Headers()
      for (let i = 0; i + 1 < response.rawHeaders.length; i += 2)
        responseHeaders.append(response.rawHeaders[i]!, response.rawHeaders[i + 1]!)
      const nullBody = init.method === 'HEAD' || status === 204 || status === 205 || status === 304
      const decoded = nullBody ? null : decode(response, responseHeaders.get('content-encoding'))
      const result = new Response(decoded ? (Readable.toWeb(decoded) as ReadableStream<Uint8Array>) : null, {
        status,
        statusText: response.statusMessage,
        headers: responseHeaders,
      })
      Object.defineProperty(result, 'url', {value: url.href})
      resolve(result)
    })
    if (body instanceof Readable) body.pipe(request)
    else request.end(body)
  })
}

/** Idle connections are closed after this, in the pool as before their first request (Node's global agents' value). */
const IDLE_MS = 5000
/** Connections opened ahead of a first request (preconnect), by `protocol//host:port`; each is handed out once. */
const earlyConnections = new Map<string, {socket: net.Socket; closeIdle: () => void}>()
const earlyKey = (protocol: string, host: string, port: number) => `${protocol}//${host}:${port}`

/**
 * Node's global agents' settings, and a connection opened ahead handed out by createConnection:
 * the request on it is built as any other (Host, keep-alive), and the connection then goes back
 * to the pool.
 */
function earlyFirst<A extends http.Agent>(agent: A, protocol: 'http:' | 'https:'): A {
  const connect = agent.createConnection.bind(agent)
  agent.createConnection = (options, callback) => {
    const key = earlyKey(protocol, String(options.host), Number(options.port))
    const early = earlyConnections.get(key)
    if (!early || early.socket.destroyed) return connect(options, callback)
    earlyConnections.delete(key)
    // from here the agent's idle rule (free sockets only) and the request's own handling apply
    early.socket.removeListener('timeout', early.closeIdle)
    return early.socket.ref()
  }
  return agent
}
const agents = {
  'http:': earlyFirst(new http.Agent({keepAlive: true, scheduling: 'lifo', timeout: IDLE_MS}), 'http:'),
  'https:': earlyFirst(new https.Agent({keepAlive: true, scheduling: 'lifo', timeout: IDLE_MS}), 'https:'),
}

/**
 * Opens the connection (TCP, and TLS for https, with the same certificate checks) that the first
 * request to `url`'s origin will use, while the caller waits for something else: a runner while
 * agent-run starts, which would otherwise pay the handshake after agent-run asked. Nothing is sent
 * on it until that request; one that closes or fails first is dropped, and the request connects
 * as usual. Not when the pool already holds an idle connection there (a running gateway).
 */
export function preconnect(url: string): void {
  let target: URL
  try {
    target = new URL(url)
  } catch {
    return
  }
  if (target.protocol !== 'http:' && target.protocol !== 'https:') return
  const host = target.hostname.replace(/^\[(.*)\]$/, '$1')
  const port = Number(target.port) || (target.protocol === 'https:' ? 443 : 80)
  const key = earlyKey(target.protocol, host, port)
  const servername = net.isIP(host) ? undefined : host
  const agent = agents[target.protocol]
  if (earlyConnections.has(key) || (agent.freeSockets[agent.getName({host, port, servername})]?.length ?? 0) > 0) return
  const socket = target.protocol === 'https:' ? tls.connect({host, port, servername}) : net.connect({host, port})
  // an unused connection must not keep alive a process that never asked (a run that failed first)
  socket.unref()
  const drop = () => {
    if (earlyConnections.get(key)?.socket === socket) earlyConnections.delete(key)
  }
  // stays: until the request adds its own listener, an error must not be unhandled
  socket.on('error', drop)
  socket.once('close', drop)
  // unused (a run that never asked), it is closed as an idle pooled one would be: a connection a
  // NAT dropped must not hang a later call
  const closeIdle = () => socket.destroy()
  socket.setTimeout(IDLE_MS, closeIdle)
  earlyConnections.set(key, {socket, closeIdle})
}

async function requestBody(body: RequestInit['body']): Promise<string | Uint8Array | Readable | undefined> {
  if (body === undefined || body === null) return undefined
  if (typeof body === 'string' || body instanceof Uint8Array) return body
  if (body instanceof ArrayBuffer) return new Uint8Array(body)
  if (ArrayBuffer.isView(body)) return new Uint8Array(body.buffer, body.byteOffset, body.byteLength)
  if (body instanceof URLSearchParams) return body.toString()
  if (body instanceof Blob) return new Uint8Array(await body.arrayBuffer())
  if (body instanceof ReadableStream) return Readable.fromWeb(body as import('node:stream/web').ReadableStream)
  throw new TypeError(`httpFetch cannot send a ${Object.prototype.toString.call(body)} body`)
}

function decode(response: http.IncomingMessage, encoding: string | null): Readable {
  const stream = {
    gzip: zlib.createGunzip,
    'x-gzip': zlib.createGunzip,
    deflate: zlib.createInflate,
    br: zlib.createBrotliDecompress,
  }[encoding?.trim().toLowerCase() ?? '']
  if (!stream) return response
  const decoder = stream()
  response.on('error', (error) => decoder.destroy(error))
  return response.pipe(decoder)
}

function abortError(signal: AbortSignal | undefined): Error {
  const reason: unknown = signal?.reason
  return reason instanceof Error && reason.name === 'AbortError'
    ? reason
    : new DOMException('This operation was aborted', 'AbortError')
}
