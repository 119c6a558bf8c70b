import net from 'node:net'
import {afterAll, beforeAll, describe, expect, it} from 'vitest'
import {freePort} from '../helpers/free-port.js'
import {runCli} from '../helpers/home.js'
import {makeEscapeWorld, requireLandlockOrSkip, type EscapeWorld} from './landlock-support.js'

// Issue 12 through `meepagateway sandbox exec` (the built CLI): each case is attempted inside the
// sandbox and the outcome is checked, on the host where it matters.
const enabled = requireLandlockOrSkip('host sandbox second wall (sandbox exec)')

let world: EscapeWorld
if (enabled) {
  beforeAll(() => {
    world = makeEscapeWorld('http://127.0.0.1:9/v1', {id: 'listener', file_access: {allow_listen: true}})
  })
  afterAll(() => world.cleanup())
}
const exec = (agent: string, script: string) =>
  runCli(['sandbox', 'exec', '--agent', agent, '--', '/bin/sh', '-c', script], {home: world.home, env: {HOME: world.operatorHome}})

/** Each attempt in its own subshell, one line per attempt: `TRY n rc=N output`. */
async function attempt(agent: string, attempts: string[]): Promise<Array<{rc: number; out: string}>> {
  const script = attempts.map((line, index) => `out=$( (${line}) 2>&1 ); echo "TRY ${index} rc=$? $(printf %s "$out" | tr '\\n' ' ' | head -c 300)"`).join('\n')
  const result = await exec(agent, script)
  expect(result.exitCode, result.stderr).toBe(0)
  const lines = result.stdout.split('\n').filter((line) => line.startsWith('TRY '))
  expect(lines).toHaveLength(attempts.length)
  return lines.map((line) => {
    const match = /^TRY \d+ rc=(\d+) ?(.*)$/.exec(line)!
    return {rc: Number(match[1]), out: match[2]!}
  })
}

const py = (code: string) => `python3 -c '${code}'`
const bindAttempts = (port: number) => [
  py(`import socket; s=socket.socket(); s.bind(("127.0.0.1", ${port})); s.listen(); print("LISTENING")`),
  py('import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); s.listen(); print("LISTENING")'),
  py('import socket; s=socket.socket(); s.listen(); print("LISTENING", s.getsockname())'),
  py('import socket; s=socket.socket(socket.AF_INET6); s.bind(("::1", 0)); s.listen(); print("LISTENING")'),
  py(`import socket; s=socket.socket(type=socket.SOCK_DGRAM); s.bind(("127.0.0.1", ${port})); print("LISTENING")`),
  py('import socket; s=socket.socket(socket.AF_INET6, socket.SOCK_DGRAM); s.bind(("::1", 0)); print("LISTENING")'),
  `node -e "require('net').createServer().listen(${port}, '127.0.0.1', () => console.log('LISTENING')).on('error', (e) => { console.error(e.message); process.exit(3) })"`,
]

function connects(port: number): Promise<boolean> {
  return new Promise((resolve) => {
    const socket = net.connect({host: '127.0.0.1', port}, () => {
      socket.destroy()
      resolve(true)
    })
    socket.on('error', () => resolve(false))
  })
}

describe.skipIf(!enabled)('no listening unless file_access.allow_listen', () => {
  it('refuses TCP and UDP binds (fixed port, port 0, IPv6) and listen() on an unbound socket, while outgoing UDP still works', async () => {
    const port = await freePort()
    const results = await attempt('open', bindAttempts(port))
    for (const [index, result] of results.entries()) {
      expect(result.rc, `attempt ${index}: ${result.out}`).not.toBe(0)
      expect(result.out, `attempt ${index}`).toMatch(/Operation not permitted|EPERM|EACCES|Permission denied/)
      expect(result.out).not.toContain('LISTENING')
    }
    expect(await connects(port)).toBe(false)
    const [udp] = await attempt('open', [py('import socket; s=socket.socket(type=socket.SOCK_DGRAM); s.sendto(b"x", ("127.0.0.1", 9)); print("SENT")')])
    expect(udp).toEqual({rc: 0, out: 'SENT'})
  })

  it('with allow_listen: true, TCP and UDP servers start and are reachable', async () => {
    const port = await freePort()
    const serve = `node -e "const s = require('net').createServer((c) => c.on('error', () => {}).end('hi')).listen(${port}, '127.0.0.1', () => console.log('LISTENING')); setTimeout(() => s.close(), 3000)"`
    const pending = attempt('listener', [serve, `sleep 1; ${bindAttempts(port + 1)[5]}`])
    let reachable = false
    for (let tries = 0; tries < 40 && !reachable; tries++) {
      reachable = await connects(port)
      if (!reachable) await new Promise((resolve) => setTimeout(resolve, 100))
    }
    expect(reachable).toBe(true)
    const [tcp, udp] = await pending
    expect(tcp).toEqual({rc: 0, out: 'LISTENING'})
    expect(udp).toEqual({rc: 0, out: 'LISTENING'})
  })
})
