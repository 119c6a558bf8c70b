import fs from 'node:fs'
import http from 'node:http'
import https from 'node:https'
import os from 'node:os'
import path from 'node:path'

/**
 * An engine that answers badly: a Docker/Podman API of the test's own, on a unix socket or (with
 * TLS files, as a TLS proxy in front of `podman system service`) on 127.0.0.1, that to every
 * request
 *   - `trickle`s a byte of a 200 answer every 500 ms, never reaching its end;
 *   - is `cut` off: says Content-Length 1000, sends 2 bytes, and drops the connection;
 *   - `flood`s: a 200 answer without end, as fast as the client reads it;
 *   - `hang`s: reads the request and never answers.
 * Every request is counted.
 *
 *   const engine = await startUnrulyEngine('flood')               // engine.host: unix://…
 *   const engine = await startUnrulyEngine('cut', {tls: server})  // engine.host: tcp://127.0.0.1:PORT
 */
export type Misbehaviour = 'trickle' | 'cut' | 'flood' | 'hang'

export interface UnrulyEngine {
  host: string
  /** Its unix socket (unset over TLS). */
  socket?: string
  requests: number
  close(): Promise<void>
}

const FLOOD_CHUNK = Buffer.alloc(64 * 1024, 'x')

export async function startUnrulyEngine(
  misbehaviour: Misbehaviour,
  options: {tls?: {ca: string; cert: string; key: string}} = {},
): Promise<UnrulyEngine> {
  const timers = new Set<NodeJS.Timeout>()
  const handler = (_request: http.IncomingMessage, response: http.ServerResponse) => {
    engine.requests++
    if (misbehaviour === 'hang') return
    if (misbehaviour === 'cut') {
      response.writeHead(200, {'Content-Length': '1000', 'Libpod-Api-Version': '4.3.1'})
      response.write('OK')
      const timer = setTimeout(() => response.socket?.destroy(), 100)
      timers.add(timer)
      return
    }
    response.writeHead(200, {'Content-Type': 'text/plain', 'Libpod-Api-Version': '4.3.1'})
    if (misbehaviour === 'trickle') {
      const timer = setInterval(() => (response.destroyed ? clearInterval(timer) : response.write('O')), 500)
      timers.add(timer)
      return
    }
    // only as fast as the client reads: the test's own memory stays small
    const pump = () => {
      while (!response.destroyed && response.write(FLOOD_CHUNK));
    }
    response.on('drain', pump)
    pump()
  }
  const server = options.tls
    ? https.createServer(
        {
          ca: fs.readFileSync(options.tls.ca),
          cert: fs.readFileSync(options.tls.cert),
          key: fs.readFileSync(options.tls.key),
          requestCert: true,
        },
        handler,
      )
    : http.createServer(handler)
  const dir = options.tls ? undefined : fs.mkdtempSync(path.join(os.tmpdir(), 'meepa-unruly-'))
  const socket = dir && path.join(dir, 'engine.sock')
  await new Promise<void>((resolve) =>
    socket ? server.listen(socket, resolve) : server.listen(0, '127.0.0.1', resolve),
  )
  const engine: UnrulyEngine = {
    host: socket ? `unix://${socket}` : `tcp://127.0.0.1:${(server.address() as {port: number}).port}`,
    ...(socket ? {socket} : {}),
    requests: 0,
    close: async () => {
      for (const timer of timers) clearTimeout(timer)
      server.closeAllConnections()
      await new Promise((resolve) => server.close(resolve))
      if (dir) fs.rmSync(dir, {recursive: true, force: true})
    },
  }
  return engine
}
