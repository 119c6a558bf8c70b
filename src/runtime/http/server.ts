import http from 'node:http'
import type {AddressInfo} from 'node:net'
import {GatewayError} from '../errors.js'
import {sendError} from './json.js'
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
}

/** The gateway's HTTP listener: one node:http server in front of the shared router. */
export async function startHttpListener(options: StartHttpOptions): Promise<HttpListener> {
  const {router, log} = options
  let closing = false
  const server = http.createServer((req, res) => {
    if (closing) res.setHeader('connection', 'close') // keep-alive clients reconnect elsewhere
    void handle(req, res)
  })
  server.requestTimeout = 0 // web chat requests wait for a whole agent run; runs have their own limits
  server.headersTimeout = 30_000
  server.keepAliveTimeout = 5_000

  async function handle(req: http.IncomingMessage, res: http.ServerResponse): Promise<void> {
    try {
      const url = new URL(req.url ?? '/', 'http://gateway.local')
      const found = router.match(req.method ?? 'GET', url.pathname)
      if (!found) throw new HttpError(404, 'E_NOT_FOUND', `no route for ${req.method} ${url.pathname}`)
      if ('allowed' in found) {
        throw new HttpError(405, 'E_USAGE', `${req.method} is not allowed on ${url.pathname}`, {allow: found.allowed.join(', ')})
      }
      await found.handler({req, res, url, params: found.params})
    } catch (error) {
      if (res.headersSent) {
        res.destroy()
        return
      }
      if (error instanceof HttpError) {
        sendError(res, error)
        return
      }
      log(`http: ${req.method} ${req.url} failed: ${(error as Error).message}`)
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
      reject(new GatewayError('E_CONFIG', `cannot listen on ${where}: ${error.code ?? error.message}`, {cause: error, suggestions: hint}))
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
