import {execFileSync} from 'node:child_process'
import dgram from 'node:dgram'
import fs from 'node:fs'
import net from 'node:net'
import os from 'node:os'
import path from 'node:path'
import YAML from 'yaml'
import {ROOT} from './home.js'

export const HELPER = path.join(ROOT, 'dist', 'native', 'meepa-sandbox')

/**
 * Whether this machine can run the real escape tests: the helper is built and the kernel has
 * Landlock ABI 6+ and seccomp. Absent, the suites skip loudly; with MEEPA_REQUIRE_LANDLOCK=1
 * (CI) they fail instead.
 */
export function landlockUnavailable(): string | undefined {
  if (process.platform !== 'linux') return `not Linux (${process.platform})`
  if (!fs.existsSync(HELPER)) return `the helper is not built (${HELPER})`
  try {
    const probe = JSON.parse(execFileSync(HELPER, ['--probe'], {encoding: 'utf8', timeout: 10_000})) as {
      landlock: {abi: number; reason?: string}
      seccomp: boolean
    }
    if (probe.landlock.abi < 6)
      return `Landlock ABI ${probe.landlock.abi} < 6 (${probe.landlock.reason ?? 'old kernel'})`
    if (!probe.seccomp) return 'seccomp filters unavailable'
    return undefined
  } catch (error) {
    return `the helper probe failed: ${(error as Error).message}`
  }
}

export function requireLandlockOrSkip(suite: string): boolean {
  const reason = landlockUnavailable()
  if (!reason) return true
  if (process.env.MEEPA_REQUIRE_LANDLOCK === '1')
    throw new Error(`${suite}: MEEPA_REQUIRE_LANDLOCK=1 but Landlock cannot be used here: ${reason}`)
  process.stderr.write(`\n!!! SKIPPING ${suite}: ${reason} (set MEEPA_REQUIRE_LANDLOCK=1 to make this a failure)\n\n`)
  return false
}

/** The planted operator home, gateway home and data trees the escape tests attack. */
export interface EscapeWorld {
  root: string
  operatorHome: string
  home: string
  key: string
  shared: {read: string; readWrite: string; blocked: string}
  workspace(id: string): string
  cleanup(): void
}

export const OPERATOR_KEY = 'OPERATOR-PRIVATE-KEY-do-not-leak'
export const CONFIG_MARKER = 'CONFIG-FILE-MARKER-do-not-leak'
export const DB_MARKER = 'GATEWAY-DB-MARKER-do-not-leak'
export const OTHER_MARKER = 'OTHER-AGENT-MARKER-do-not-leak'
export const DENIED_MARKER = 'DENIED-FILE-MARKER-do-not-leak'

/**
 * Agents: `locked` (network off, allow_read/allow_read_write/deny set), `open` (defaults, network on),
 * `other` (the neighbour whose workspace must stay out of reach).
 */
export function makeEscapeWorld(llmBaseUrl: string, extraAgent: Record<string, unknown> = {}): EscapeWorld {
  const root = fs.realpathSync(fs.mkdtempSync(path.join(os.tmpdir(), 'meepa-escape-')))
  const operatorHome = path.join(root, 'operator-home')
  const home = path.join(root, 'gateway-home')
  const key = path.join(operatorHome, '.ssh', 'id_ed25519')
  const shared = {
    read: path.join(root, 'shared-read'),
    readWrite: path.join(root, 'shared-rw'),
    blocked: path.join(root, 'shared-rw', 'blocked'),
  }
  const write = (file: string, content: string) => {
    fs.mkdirSync(path.dirname(file), {recursive: true})
    fs.writeFileSync(file, content)
  }
  write(key, OPERATOR_KEY)
  write(path.join(operatorHome, 'notes.txt'), 'operator notes')
  write(path.join(shared.read, 'readme.txt'), 'shared read-only data')
  write(path.join(shared.readWrite, 'data.txt'), 'shared writable data\n')
  write(path.join(shared.blocked, 'inner.txt'), DENIED_MARKER)
  write(path.join(home, 'gateway.db'), DB_MARKER)
  const workspace = (id: string) => path.join(home, 'agents', id)
  write(path.join(workspace('other'), 'notes.txt'), OTHER_MARKER)
  write(path.join(workspace('locked'), 'private', 'secret.txt'), DENIED_MARKER)
  write(path.join(workspace('locked'), 'work', 'draft.txt'), 'draft')
  fs.mkdirSync(workspace('open'), {recursive: true})
  const config = {
    _marker: CONFIG_MARKER,
    providers: {
      primary: 'fake',
      providers: {fake: {kind: 'openai', api_key_env: 'FAKE_LLM_KEY', model: 'fake-model', base_url: llmBaseUrl}},
    },
    agents: [
      {
        id: 'locked',
        timeout_seconds: 60,
        file_access: {
          allow_network: false,
          allow_read: [shared.read],
          allow_read_write: [shared.readWrite],
          deny: ['private', shared.blocked],
        },
      },
      {id: 'open', timeout_seconds: 60},
      {id: 'other'},
      ...(Object.keys(extraAgent).length > 0 ? [extraAgent] : []),
    ],
  }
  fs.writeFileSync(path.join(home, 'config.yaml'), YAML.stringify(config).replace(/^_marker: (.*)$/m, '# $1'))
  return {
    root,
    operatorHome,
    home,
    key,
    shared,
    workspace,
    cleanup: () => fs.rmSync(root, {recursive: true, force: true}),
  }
}

/** A loopback TCP listener and UDP socket that count what reaches them. */
export async function loopbackListeners(): Promise<{
  tcpPort: number
  udpPort: number
  tcpConnections: () => number
  udpMessages: () => number
  close: () => void
}> {
  let tcp = 0
  let udp = 0
  const server = net.createServer((socket) => {
    tcp++
    socket.destroy()
  })
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve))
  const socket = dgram.createSocket('udp4')
  socket.on('message', () => udp++)
  await new Promise<void>((resolve) => socket.bind(0, '127.0.0.1', resolve))
  return {
    tcpPort: (server.address() as net.AddressInfo).port,
    udpPort: socket.address().port,
    tcpConnections: () => tcp,
    udpMessages: () => udp,
    close: () => {
      server.close()
      socket.close()
    },
  }
}

export const nodeTcp = (port: number) =>
  `node -e "require('net').connect({host:'127.0.0.1',port:${port}}).on('connect',()=>{console.log('CONNECTED');process.exit(0)}).on('error',e=>{console.error(e.message);process.exit(3)})"`
export const nodeUdp = (port: number) =>
  `node -e "try{const s=require('dgram').createSocket('udp4');s.send('leak',${port},'127.0.0.1',e=>{if(e){console.error(e.message);process.exit(3)}console.log('SENT');process.exit(0)})}catch(e){console.error(e.message);process.exit(3)}"`
