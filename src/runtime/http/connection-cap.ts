import fs from 'node:fs'
import type http from 'node:http'
import type net from 'node:net'

/** Connections the listener holds at most, whatever the descriptor limit. */
const MAX_CONNECTIONS = 1024

/** The soft RLIMIT_NOFILE of this process (Linux; a conservative guess elsewhere). */
function openFileLimit(): number {
  try {
    const match = /^Max open files\s+(\d+|unlimited)/m.exec(fs.readFileSync('/proc/self/limits', 'utf8'))
    if (match) return match[1] === 'unlimited' ? Number.MAX_SAFE_INTEGER : Number(match[1])
  } catch {
    // not Linux
  }
  return 1024
}

/**
 * Connections may use at most half of the process's file descriptors: the rest start agent runs,
 * keep connectors and SQLite open. Without a cap, a local process opening idle connections
 * leaves the gateway unable to spawn a run or reconnect a connector.
 */
export function connectionCap(limit = openFileLimit()): number {
  return Math.max(16, Math.min(MAX_CONNECTIONS, Math.floor(limit / 2)))
}

/**
 * Holds the server to `cap` connections. At the cap a new connection pushes out the oldest one
 * that is not being answered (idle, its request has not arrived whole, or it does not read its
 * answer): a flood of idle, trickling or stalled connections then cannot keep out a client that
 * sends its request at once, and replies being worked on (web chat runs, build streams) are never cut.
 */
export function capConnections(server: http.Server, cap: number, onFull: (line: string) => void): void {
  const open = new Map<net.Socket, {request?: http.IncomingMessage}>() // oldest first
  server.on('connection', (socket: net.Socket) => {
    if (open.size >= cap) {
      let evicted: net.Socket | undefined
      for (const [candidate, state] of open) {
        // being answered, and the client reads what it is sent: keep it (a run's reply, a build stream)
        if (state.request && state.request.complete && candidate.writableLength === 0) continue
        evicted = candidate
        break
      }
      onFull(
        `http: ${cap} connections are open (the cap); ${evicted ? 'closing the oldest idle one' : 'refusing a new one'} (a local process may be flooding the port)`,
      )
      if (!evicted) {
        socket.destroy()
        return
      }
      open.delete(evicted)
      evicted.destroy()
    }
    open.set(socket, {})
    socket.once('close', () => open.delete(socket))
  })
  server.on('request', (req: http.IncomingMessage, res: http.ServerResponse) => {
    const state = open.get(req.socket)
    if (!state) return
    state.request = req
    res.once('close', () => {
      if (state.request === req) state.request = undefined
    })
  })
}
