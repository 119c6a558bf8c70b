import http from 'node:http'
import type {AddressInfo} from 'node:net'
import {isLoopbackBind} from './bind.js'
import {capConnections, connectionCap} from './connection-cap.js'
import {GatewayError} from '../util/errors.js'
import {bodyTooLarge, MAX_BODY_BYTES, sendError} from './json.js'
import {closeLingering} from './lingering-close.js'
import {HttpError, type Router} from './router.js'

export interface HttpListener {
  /** `http://host:port`, with the port actually bound (useful with port 0 in tests). */
  readonly url: string
  readonly port: number
  /** Stops accepting connections; requests already being handled finish first. */
  close(): Promise<void>
}

export interface StartHttpOptions {
  bind: string
  port: number
  router: Router
  log: (line: string) => void
  /** Host names besides loopback ones that requests may name (captain.allowed_hosts); read per request. */
  allowedHosts?: () => readonly string[]
  /** A request (headers and body) that has not arrived whole by then is dropped (default 60 s). */
  requestTimeoutMs?: number
  /** Connections held open at most (default: half the process's descriptor limit, at most 1024). */
  maxConnections?: number
}

/** The default for requests that have not arrived whole; the reply to one that has may take as long as its run. */
export const REQUEST_TIMEOUT_MS = 60_000
/** Lines about failed requests per minute; a flood of aborted requests must not flood the log. */
const FAILURE_LOG_LINES_PER_MINUTE = 10

/**
 * Whether a request's Host header names this gateway: a loopback name or address (any port), or
 * one of `allowed`. Anything else is a page on another site that rebound its DNS name to
 * 127.0.0.1 (DNS rebinding), and must not read or try anything.
 */
export function hostAllowed(host: string | undefined, allowed: readonly string[] = []): boolean {
  if (!host) return false
  const lower = host.trim().toLowerCase()
  // `name[:port]` or `[v6][:port]`, nothing else: junk after either must not slip through
  const parsed = /^(\[[0-9a-f:.]+\]|[^:[\]]+)(?::\d+)?$/.exec(lower)
  if (!parsed) return false
  const name = parsed[1] as string
  if (isLoopbackBind(name)) return true
  return allowed.some((entry) => {
    const wanted = entry.trim().toLowerCase()
    return wanted === lower || wanted === name
  })
}

/**
 * The Host a request names: its only Host header, and the authority of an absolute-form target
 * (`GET http://host/path`) must name an allowed host too. Two Host headers name none.
 */
function requestHostsAllowed(req: http.IncomingMessage, allowed: readonly string[]): boolean {
  const hostHeaders = req.rawHeaders.filter((name, index) => index % 2 === 0 && name.toLowerCase() === 'host')
  if (hostHeaders.length !== 1 || !hostAllowed(req.headers.host, allowed)) return false
  const target = req.url ?? '/'
  if (target.startsWith('/') || target === '*') return true
  try {
    return hostAllowed(new URL(target).host, allowed)
  } catch {
    return false
  }
}

/** The gateway's HTTP listener: one node:http server in front of the shared router. */
export async function startHttpListener(options: StartHttpOptions): Promise<HttpListener> {
  const {router, log} = options
  let closing = false
  const requestTimeout = options.requestTimeoutMs ?? REQUEST_TIMEOUT_MS
  // requestTimeout covers receiving the request only: web chat replies wait for a whole agent run
  const server = http.createServer(
    {
      requestTimeout,
      headersTimeout: Math.min(30_000, requestTimeout),
      connectionsCheckingInterval: Math.min(5_000, requestTimeout / 2),
    },
    (req, res) => {
      if (closing) res.setHeader('connection', 'close') // keep-alive clients reconnect elsewhere
      void handle(req, res)
    },
  )
  server.keepAliveTimeout = 5_000
  // `Expect: 100-continue` is answered by the route: `100 Continue` when it reads the body, a final answer otherwise
  server.on('checkContinue', (req: http.IncomingMessage, res: http.ServerResponse) => server.emit('request', req, res))
  closeLingering(server)
  const failureLog = rateLimitedLog(log, FAILURE_LOG_LINES_PER_MINUTE)
  capConnections(server, options.maxConnections ?? connectionCap(), rateLimitedLog(log, FAILURE_LOG_LINES_PER_MINUTE))

  async function handle(req: http.IncomingMessage, res: http.ServerResponse): Promise<void> {
    try {
      // before anything else: a rebound DNS name gets nothing, not even the login state
      if (!requestHostsAllowed(req, options.allowedHosts?.() ?? [])) {
        throw new HttpError(
          421,
          'E_AUTH',
          `this gateway does not answer to Host ${JSON.stringify(req.headers.host ?? '')}; use 127.0.0.1 or localhost, or add the name to captain.allowed_hosts`,
        )
      }
      const url = new URL(req.url ?? '/', 'http://gateway.local')
      const found = router.match(req.method ?? 'GET', url.pathname)
      // no route reads more than it says; one that reads nothing must not hold the connection for the upload either
      const maxBody = (found && 'maxBodyBytes' in found && found.maxBodyBytes?.()) || MAX_BODY_BYTES
      if (Number(req.headers['content-length']) > maxBody) throw bodyTooLarge(maxBody)
      if (!found) throw new HttpError(404, 'E_NOT_FOUND', `no route for ${req.method} ${url.pathname}`)
      if ('allowed' in found) {
        throw new HttpError(405, 'E_USAGE', `${req.method} is not allowed on ${url.pathname}`, {
          allow: found.allowed.join(', '),
        })
      }
      await found.handler({req, res, url, params: found.params})
    } catch (error) {
      if (res.headersSent) {
        res.destroy()
        return
      }
      if (req.readableAborted) {
        failureLog(
          `http: ${req.method} ${req.url?.slice(0, 200)}: the client went away before the request arrived whole`,
        )
        return
      }
      if (error instanceof HttpError) {
        sendError(res, error)
        return
      }
      if (req.destroyed || req.readableAborted) return // the client went away mid-request: nothing to answer
      failureLog(`http: ${req.method} ${req.url?.slice(0, 200)} failed: ${(error as Error).message}`)
      sendError(res, new HttpError(500, 'E_INTERNAL', 'internal error; the gateway log has the details'))
    }
  }

  await new Promise<void>((resolve, reject) => {
    const onError = (error: NodeJS.ErrnoException) => {
      const where = `${options.bind}:${options.port}`
      const hint =
        error.code === 'EADDRINUSE'
          ? [`another process (another gateway?) listens on ${where}`, 'stop it, or set captain.port in config.yaml']
          : [`check captain.bind and captain.port in config.yaml`]
      reject(
        new GatewayError('E_CONFIG', `cannot listen on ${where}: ${error.code ?? error.message}`, {
          cause: error,
          suggestions: hint,
        }),
      )
    }
    server.once('error', onError)
    server.listen(options.port, options.bind, () => {
      server.off('error', onError)
      resolve()
    })
  })
  const address = server.address() as AddressInfo
  const host = address.family === 'IPv6' ? `[${address.address}]` : address.address

  return {
    url: `http://${host}:${address.port}`,
    port: address.port,
    close: () =>
      new Promise<void>((resolve) => {
        closing = true
        server.close(() => resolve())
        server.closeIdleConnections()
      }),
  }
}

/** `log`, but at most `perMinute` lines a minute; what was dropped is counted in the next line. */
function rateLimitedLog(log: (line: string) => void, perMinute: number): (line: string) => void {
  let windowStart = 0
  let written = 0
  let dropped = 0
  return (line) => {
    const now = Date.now()
    if (now - windowStart >= 60_000) {
      windowStart = now
      written = 0
    }
    if (written >= perMinute) {
      dropped++
      return
    }
    written++
    log(dropped > 0 ? `${line} (${dropped} similar line(s) not logged)` : line)
    dropped = 0
  }
}
