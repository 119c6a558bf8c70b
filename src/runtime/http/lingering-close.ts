import type http from 'node:http'
import type net from 'node:net'

/** How long a closing connection keeps reading (and discarding) what its client still sends. */
export const LINGER_MS = 2_000

/**
 * Node ends the last response on a connection with `socket.destroySoon()`: FIN, then close(2) as
 * soon as the response is flushed. When the client is still sending a body the gateway did not
 * read (a 413, an answer without `100 Continue`), close(2) with unread bytes sends a reset, and the
 * client's kernel may throw the answer away before the client reads it: the client sees
 * "connection reset" instead of the 413. So connections close as Apache's lingering close does:
 * FIN once the response is flushed, then whatever still arrives is read and dropped until the
 * client closes too, for at most `lingerMs`.
 */
export function closeLingering(server: http.Server, lingerMs = LINGER_MS): void {
  server.on('connection', (socket: net.Socket) => {
    socket.destroySoon = () => {
      socket.end()
      const linger = () => {
        const timer = setTimeout(() => socket.destroy(), lingerMs)
        socket.once('close', () => clearTimeout(timer))
      }
      if (socket.writableFinished) linger()
      else socket.once('finish', linger)
    }
  })
}
