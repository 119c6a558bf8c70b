import dgram from 'node:dgram'
import fs from 'node:fs'
import net from 'node:net'
import os from 'node:os'
import path from 'node:path'
import {HELPER_SETUP_EXIT} from '../../sandbox/landlock/helper.js'
import {CONTAINER_SOCKETS} from '../../sandbox/policy.js'
import type {LoadedConfig} from '../config/types.js'
import {GatewayError} from '../util/errors.js'
import {randomHex} from '../util/random.js'
import {APP_ROOT} from '../util/app-root.js'
import {isolationLevelFor} from '../shapes/isolation-level.js'
import {openAgentSandbox, spawnInSandbox, type AgentSandbox} from './exec.js'
import {reclaimWorkspace} from '../run-lifecycle/workspace-owner.js'

/**
 * `sandbox check`: under an agent's real policy, attempt each forbidden operation (it must fail
 * with EACCES/EPERM, not for some other reason) and each allowed one (it must succeed).
 * Files the probes would create are uniquely named and removed afterwards, whatever happened.
 */

export interface ProbeResult {
  name: string
  expect: 'allowed' | 'denied'
  pass: boolean
  skipped?: boolean
  detail?: string
}

export interface SandboxCheckResult {
  agent: string
  landlock_abi: number
  network: 'allow' | 'deny'
  probes: ProbeResult[]
}

interface Probe {
  name: string
  expect: 'allowed' | 'denied'
  argv?: string[]
  /** Why the probe cannot run on this machine (nothing to attempt). */
  skip?: string
  /** Extra check of a successful command's output. */
  verify?: (stdout: string) => string | undefined
  cleanup?: string[]
  /** A rename the probe attempts: put back if it wrongly succeeded. */
  restore?: {from: string; to: string}
}

// EXDEV: Landlock refuses a link or rename that would give a file more rights than it has. EBUSY,
// EROFS: the namespace layer's read-only covers. ESRCH: a host pid is absent from the PID namespace.
const DENIED_ERROR =
  /Permission denied|Operation not permitted|EACCES|EPERM|Invalid cross-device link|EXDEV|Device or resource busy|EBUSY|Read-only file system|EROFS|No such process|ESRCH/
const PROBE_TIMEOUT_MS = 15_000

export async function sandboxCheck(loaded: LoadedConfig, agentId?: string): Promise<SandboxCheckResult[]> {
  const ids = agentId
    ? [agentId]
    : loaded.config.agents.filter((agent) => isolationLevelFor(agent) === 'host-sandbox').map((agent) => agent.id)
  if (ids.length === 0) {
    throw new GatewayError('E_USAGE', 'no agent uses the host sandbox', {
      suggestions: ['pass --agent ID to check a specific agent'],
    })
  }
  const results: SandboxCheckResult[] = []
  for (const id of ids) {
    const sandbox = await openAgentSandbox(loaded, id)
    try {
      await reclaimWorkspace(sandbox.workspace)
      results.push(await checkAgent(loaded, sandbox))
    } finally {
      await sandbox.dispose()
    }
  }
  return results
}

async function checkAgent(loaded: LoadedConfig, sandbox: AgentSandbox): Promise<SandboxCheckResult> {
  const tcp = await listenTcp()
  const udp = await listenUdp()
  try {
    const probes = buildProbes(loaded, sandbox, tcp.port, udp.port)
    const results: ProbeResult[] = []
    for (const probe of probes) results.push(await runProbe(sandbox, probe))
    return {
      agent: sandbox.agent.id,
      landlock_abi: sandbox.probe.landlock.abi,
      network: sandbox.policy.network,
      probes: results,
    }
  } finally {
    tcp.close()
    udp.close()
  }
}

function buildProbes(loaded: LoadedConfig, sandbox: AgentSandbox, tcpPort: number, udpPort: number): Probe[] {
  const tag = `.meepa-sandbox-check-${randomHex(4)}`
  const {policy, workspace, tmpDir} = sandbox
  const node = process.execPath
  const sh = (script: string) => ['/bin/sh', '-c', script]
  const quote = (text: string) => `'${text.replaceAll("'", `'\\''`)}'`
  const readFirstByte = (file: string) => sh(`head -c1 ${quote(file)} >/dev/null`)
  const createFile = (file: string) => sh(`: > ${quote(file)} && rm -f ${quote(file)}`)
  const existingFile = (file: string) => fs.existsSync(file) && fs.statSync(file).isFile()
  const renameAside = (denied: string): Probe => ({
    name: `rename denied ${denied} aside`,
    expect: 'denied',
    argv: sh(`mv ${quote(denied)} ${quote(denied + tag)}`),
    restore: {from: denied + tag, to: denied},
  })
  const probes: Probe[] = []

  // forbidden: the gateway's own secrets and state
  probes.push(
    existingFile(loaded.path)
      ? {name: `read the gateway config (${loaded.path})`, expect: 'denied', argv: readFirstByte(loaded.path)}
      : {name: 'read the gateway config', expect: 'denied', skip: 'no config file'},
  )
  const db = path.join(loaded.home, 'gateway.db')
  probes.push(
    existingFile(db)
      ? {name: 'read gateway.db', expect: 'denied', argv: readFirstByte(db)}
      : {name: 'read gateway.db', expect: 'denied', skip: 'no gateway.db yet'},
  )
  const outside = path.join(loaded.home, tag)
  probes.push({
    name: 'write into MEEPAGATEWAY_HOME outside the workspace',
    expect: 'denied',
    argv: createFile(outside),
    cleanup: [outside],
  })
  const other = loaded.config.agents.find(
    (agent) => agent.id !== sandbox.agent.id && fs.existsSync(path.join(loaded.home, 'agents', agent.id)),
  )
  if (other) {
    const otherWs = path.join(loaded.home, 'agents', other.id)
    const soul = path.join(otherWs, 'SOUL.md')
    if (existingFile(soul))
      probes.push({name: `read another agent's workspace (${other.id})`, expect: 'denied', argv: readFirstByte(soul)})
    probes.push({
      name: `write another agent's workspace (${other.id})`,
      expect: 'denied',
      argv: createFile(path.join(otherWs, tag)),
      cleanup: [path.join(otherWs, tag)],
    })
  } else probes.push({name: "read another agent's workspace", expect: 'denied', skip: 'no other agent workspace'})

  // forbidden: the operator's home
  const dotfile = sandbox.agent.file_access.allow_home_dotfiles ? undefined : firstDotfile(os.homedir())
  probes.push(
    dotfile
      ? {name: `read an operator dotfile (${dotfile})`, expect: 'denied', argv: readFirstByte(dotfile)}
      : {
          name: 'read an operator dotfile',
          expect: 'denied',
          skip: sandbox.agent.file_access.allow_home_dotfiles
            ? 'allow_home_dotfiles is true'
            : 'no readable dotfile in the home',
        },
  )

  // forbidden: writes outside the workspace and temp dir
  const sharedTmp = path.join(os.tmpdir(), tag)
  probes.push({
    name: `write outside the workspace (${sharedTmp})`,
    expect: 'denied',
    argv: createFile(sharedTmp),
    cleanup: [sharedTmp],
  })
  const inApp = path.join(APP_ROOT, tag)
  probes.push({name: 'write into the installed app', expect: 'denied', argv: createFile(inApp), cleanup: [inApp]})

  // forbidden: the config's deny paths, including move-aside and hard links
  for (const deny of policy.denies.filter((entry) => entry.source === 'config' && entry.exists)) {
    if (existingFile(deny.path)) {
      probes.push({name: `read denied ${deny.path}`, expect: 'denied', argv: readFirstByte(deny.path)})
      probes.push(renameAside(deny.path))
      probes.push({
        name: `hard-link denied ${deny.path} into TMPDIR`,
        expect: 'denied',
        argv: sh(`ln ${quote(deny.path)} ${quote(path.join(tmpDir, tag))}`),
      })
    } else {
      const inside = path.join(deny.path, tag)
      probes.push({
        name: `create a file in denied ${deny.path}`,
        expect: 'denied',
        argv: createFile(inside),
        cleanup: [inside],
      })
      probes.push(renameAside(deny.path))
    }
  }

  // forbidden: reaching out of the sandbox through the kernel
  const socket = CONTAINER_SOCKETS.find((candidate) => fs.existsSync(candidate))
  probes.push(
    socket
      ? {
          name: `connect to the container engine socket (${socket})`,
          expect: 'denied',
          argv: [node, '-e', nodeConnect(`{path: ${JSON.stringify(socket)}}`)],
        }
      : {name: 'connect to the container engine socket', expect: 'denied', skip: 'no Docker socket on this machine'},
  )
  probes.push({
    name: 'signal a process outside the sandbox (the gateway)',
    expect: 'denied',
    argv: sh(`kill -0 ${process.pid}`),
  })
  probes.push(
    sandbox.namespaces.available
      ? {
          name: "host processes are invisible (the gateway's pid is absent from /proc)",
          expect: 'allowed',
          argv: sh(`test ! -e /proc/${process.pid} && ! ls /proc | grep -qx ${process.pid}`),
        }
      : {
          name: 'host processes are invisible',
          expect: 'allowed',
          skip: `no PID namespace: ${sandbox.namespaces.reason}`,
        },
  )
  probes.push(
    sandbox.namespaces.available
      ? {
          name: 'open a pseudo-terminal (private devpts)',
          expect: 'allowed',
          argv: [node, '-e', "require('fs').closeSync(require('fs').openSync('/dev/ptmx', 'r+'))"],
        }
      : {name: 'open a pseudo-terminal', expect: 'allowed', skip: `no private devpts: ${sandbox.namespaces.reason}`},
  )
  if (policy.listen === 'deny' && policy.network === 'allow') {
    probes.push({
      name: 'listen on a TCP port (allow_listen: false)',
      expect: 'denied',
      argv: [
        node,
        '-e',
        "require('net').createServer().listen(0, '127.0.0.1', () => process.exit(0)).on('error', (e) => { console.error(e.message); process.exit(1) })",
      ],
    })
  }
  probes.push(
    commandExists('setsid')
      ? {name: 'leave the process group (setsid)', expect: 'denied', argv: ['setsid', '-w', 'true']}
      : {name: 'leave the process group', expect: 'denied', skip: 'no setsid binary'},
  )
  probes.push({
    name: 'no_new_privs set and no capabilities',
    expect: 'allowed',
    argv: ['cat', '/proc/self/status'],
    verify: (out) =>
      /NoNewPrivs:\s*1/.test(out) && /CapEff:\s*0+\n/.test(out) && /CapBnd:\s*0+\n/.test(out)
        ? undefined
        : 'NoNewPrivs/CapEff/CapBnd not as expected',
  })
  const secretNames = Object.keys(loaded.secrets)
  const secretValues = Object.values(loaded.secrets).filter((value) => value.length >= 6)
  probes.push({
    name: 'no secret in the environment',
    expect: 'allowed',
    argv: ['env'],
    verify: (out) => {
      const leaked = secretNames
        .filter((name) => out.includes(`${name}=`))
        .concat(secretValues.some((value) => out.includes(value)) ? ['(a secret value)'] : [])
      return leaked.length > 0 ? `leaked: ${leaked.join(', ')}` : undefined
    },
  })

  // network
  if (policy.network === 'deny') {
    probes.push({
      name: `TCP connect to 127.0.0.1:${tcpPort}`,
      expect: 'denied',
      argv: [node, '-e', nodeConnect(`{host: '127.0.0.1', port: ${tcpPort}}`)],
    })
    probes.push({name: `UDP send to 127.0.0.1:${udpPort}`, expect: 'denied', argv: [node, '-e', nodeUdp(udpPort)]})
  } else {
    probes.push({
      name: `TCP connect to 127.0.0.1:${tcpPort}`,
      expect: 'allowed',
      argv: [node, '-e', nodeConnect(`{host: '127.0.0.1', port: ${tcpPort}}`)],
    })
    probes.push({
      name: 'read the DNS configuration (/etc/resolv.conf and its target)',
      expect: 'allowed',
      argv: sh('cat /etc/resolv.conf >/dev/null'),
    })
    const bundle = ['/etc/ssl/certs/ca-certificates.crt', '/etc/pki/tls/certs/ca-bundle.crt'].find(existingFile)
    if (bundle)
      probes.push({name: `read the TLS trust store (${bundle})`, expect: 'allowed', argv: readFirstByte(bundle)})
  }

  // allowed: what an agent needs
  const workspaceLowered = policy.lowered.some((dir) => dir.path === fs.realpathSync(workspace))
  probes.push(
    workspaceLowered
      ? {
          name: 'create a file in the workspace root',
          expect: 'allowed',
          skip: 'a deny inside the workspace makes its root listing-only (see sandbox explain)',
        }
      : {
          name: 'create and remove a file in the workspace',
          expect: 'allowed',
          argv: createFile(path.join(workspace, tag)),
          cleanup: [path.join(workspace, tag)],
        },
  )
  if (existingFile(path.join(workspace, 'SOUL.md')))
    probes.push({
      name: 'read SOUL.md in the workspace',
      expect: 'allowed',
      argv: readFirstByte(path.join(workspace, 'SOUL.md')),
    })
  probes.push({name: 'create and remove a file in TMPDIR', expect: 'allowed', argv: createFile(path.join(tmpDir, tag))})
  probes.push({
    name: 'run /bin/sh and the system tools',
    expect: 'allowed',
    argv: sh('ls /usr/bin >/dev/null && echo ok | grep -q ok'),
  })
  probes.push({name: 'run Node', expect: 'allowed', argv: [node, '-e', 'process.exit(0)']})
  probes.push({name: 'write /dev/null', expect: 'allowed', argv: sh('echo x > /dev/null')})
  for (const grant of policy.grants.filter((entry) => entry.reason.startsWith('allow_read'))) {
    const rw = grant.access === 'read-write'
    const file = existingFile(grant.path) ? grant.path : undefined
    if (!rw)
      probes.push({
        name: `read ${grant.path} (${grant.reason})`,
        expect: 'allowed',
        argv: file ? readFirstByte(file) : ['ls', grant.path],
      })
    else if (file)
      probes.push({name: `write ${grant.path} (${grant.reason})`, expect: 'allowed', argv: sh(`: >> ${quote(file)}`)})
    else if (policy.lowered.some((dir) => dir.path === grant.path))
      probes.push({name: `create a file in ${grant.path}`, expect: 'allowed', skip: 'listing-only: a deny lies inside'})
    else
      probes.push({
        name: `create and remove a file in ${grant.path} (${grant.reason})`,
        expect: 'allowed',
        argv: createFile(path.join(grant.path, tag)),
        cleanup: [path.join(grant.path, tag)],
      })
  }
  return probes
}

async function runProbe(sandbox: AgentSandbox, probe: Probe): Promise<ProbeResult> {
  const base = {name: probe.name, expect: probe.expect}
  if (probe.skip || !probe.argv) return {...base, pass: true, skipped: true, detail: probe.skip}
  try {
    const {child} = await spawnInSandbox(sandbox, probe.argv, {stdio: 'pipe', timeoutMs: PROBE_TIMEOUT_MS})
    const result = await child
    const stderr = String(result.stderr ?? '').trim()
    if (result.exitCode === HELPER_SETUP_EXIT && stderr.startsWith('meepa-sandbox:'))
      return {...base, pass: false, detail: `the helper refused: ${stderr}`}
    if (probe.expect === 'denied') {
      if (result.exitCode === 0) return {...base, pass: false, detail: 'the operation SUCCEEDED'}
      if (!DENIED_ERROR.test(stderr))
        return {
          ...base,
          pass: false,
          detail: `failed, but not with EACCES/EPERM: ${stderr.split('\n')[0] || `exit ${result.exitCode}`}`,
        }
      return {...base, pass: true}
    }
    if (result.exitCode !== 0)
      return {...base, pass: false, detail: stderr.split('\n')[0] || `exit ${result.exitCode ?? result.signal}`}
    const problem = probe.verify?.(String(result.stdout ?? ''))
    return problem ? {...base, pass: false, detail: problem} : {...base, pass: true}
  } finally {
    for (const file of probe.cleanup ?? []) fs.rmSync(file, {force: true, recursive: true})
    if (probe.restore && fs.existsSync(probe.restore.from)) fs.renameSync(probe.restore.from, probe.restore.to)
  }
}

function nodeConnect(target: string): string {
  return `require('net').connect(${target}).on('connect', () => process.exit(0)).on('error', (e) => { console.error(e.message); process.exit(1) })`
}

function nodeUdp(port: number): string {
  return `try { const s = require('dgram').createSocket('udp4'); s.send('x', ${port}, '127.0.0.1', (e) => { if (e) { console.error(e.message); process.exit(1) } process.exit(0) }) } catch (e) { console.error(e.message); process.exit(1) }`
}

function firstDotfile(home: string): string | undefined {
  const candidates = ['.ssh/id_ed25519', '.ssh/id_rsa', '.bashrc', '.profile', '.gitconfig', '.npmrc']
  for (const candidate of candidates) {
    const file = path.join(home, candidate)
    try {
      fs.accessSync(file, fs.constants.R_OK)
      if (fs.statSync(file).isFile()) return file
    } catch {
      // try the next one
    }
  }
  return undefined
}

function commandExists(name: string): boolean {
  return ['/usr/bin', '/bin', '/usr/sbin', '/sbin'].some((dir) => fs.existsSync(path.join(dir, name)))
}

function listenTcp(): Promise<{port: number; close: () => void}> {
  return new Promise((resolve, reject) => {
    const server = net.createServer((socket) => socket.destroy())
    server.once('error', reject)
    server.listen(0, '127.0.0.1', () =>
      resolve({port: (server.address() as net.AddressInfo).port, close: () => server.close()}),
    )
  })
}

function listenUdp(): Promise<{port: number; close: () => void}> {
  return new Promise((resolve, reject) => {
    const socket = dgram.createSocket('udp4')
    socket.once('error', reject)
    socket.bind(0, '127.0.0.1', () => resolve({port: socket.address().port, close: () => socket.close()}))
  })
}
