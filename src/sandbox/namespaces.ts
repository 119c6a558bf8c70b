import {execFile, spawnSync} from 'node:child_process'
import fs from 'node:fs'
import path from 'node:path'
import type {SandboxPolicy} from './policy.js'

/**
 * The namespace layer of the host sandbox: bubblewrap (the tool Flatpak, codex and Anthropic's
 * sandbox-runtime use) starts the helper in new user, mount, PID and IPC namespaces. There, denied
 * entries inside a grant are covered by mounts (so Landlock can give their parent full rights), /proc
 * shows the run's own processes only and /dev/pts is a private instance. Order of the layers:
 * bwrap -> meepa-sandbox (Landlock + seccomp) -> the command, so Landlock applies inside.
 */
export interface NamespaceProbe {
  available: boolean
  bwrap?: string
  /** Why the layer is off (missing bwrap, namespaces refused by the kernel, disabled). */
  reason?: string
}

/** Test hook: makes the layer look unavailable (it can only weaken what the sandbox gets, and says so). */
export const NO_NAMESPACES_ENV = 'MEEPA_SANDBOX_NO_NAMESPACES'

const BWRAP_CANDIDATES = ['/usr/bin/bwrap', '/usr/local/bin/bwrap', '/bin/bwrap']

let cached: {probe: Promise<NamespaceProbe>; at: number} | undefined
/** A failed probe is tried again after this long: one slow start under load must not cost the layer for good. */
const RETRY_FAILED_PROBE_MS = 60_000

/** Whether bubblewrap can create the namespaces on this machine: tried with the real options, once per process while it works. */
export async function probeNamespaces(): Promise<NamespaceProbe> {
  const refused = probeRefused()
  if (refused) return refused
  if (cached && !(await cached.probe).available && Date.now() - cached.at > RETRY_FAILED_PROBE_MS) cached = undefined
  cached ??= {probe: runProbe(), at: Date.now()}
  return cached.probe
}

let settled: {probe: NamespaceProbe; at: number} | undefined

/**
 * The same probe for one-shot commands (`config check`), which have no event loop to keep free:
 * spawnSync costs a third of execFile's CPU (no ChildProcess, pipes or streams). Kept as the
 * asynchronous one is: while it works, and a failure for RETRY_FAILED_PROBE_MS.
 */
export function probeNamespacesSync(): NamespaceProbe {
  const refused = probeRefused()
  if (refused) return refused
  if (settled && (settled.probe.available || Date.now() - settled.at <= RETRY_FAILED_PROBE_MS)) return settled.probe
  settled = {probe: runProbeSync(), at: Date.now()}
  return settled.probe
}

function runProbeSync(): NamespaceProbe {
  const bwrap = findBwrap()
  if (!bwrap) return NO_BWRAP
  const result = spawnSync(bwrap, [...namespaceOptions(), '--', '/bin/true'], {timeout: PROBE_TIMEOUT_MS, env: {}, encoding: 'utf8', stdio: ['ignore', 'ignore', 'pipe']})
  let failure: string | undefined
  if (result.error) failure = (result.error as NodeJS.ErrnoException).code === 'ETIMEDOUT' ? 'timed out after 10 s' : result.error.message
  else if (result.status !== 0) failure = result.status === null ? `killed by ${result.signal}` : `exit ${result.status}`
  return probeResult(bwrap, failure, result.stderr ?? '')
}

const PROBE_TIMEOUT_MS = 10_000
const NO_BWRAP: NamespaceProbe = {available: false, reason: 'bubblewrap is not installed (apt-get install bubblewrap)'}

function probeRefused(): NamespaceProbe | undefined {
  if (process.platform !== 'linux') return {available: false, reason: `namespaces are Linux only (this is ${process.platform})`}
  if (process.env[NO_NAMESPACES_ENV]) return {available: false, reason: `disabled by ${NO_NAMESPACES_ENV}`}
  return undefined
}

const findBwrap = () => BWRAP_CANDIDATES.find((candidate) => isExecutable(candidate))

async function runProbe(): Promise<NamespaceProbe> {
  const bwrap = findBwrap()
  if (!bwrap) return NO_BWRAP
  // node's execFile, not execa: `sandbox exec` runs this at start, and execa's set-up costs more than bwrap
  const result = await new Promise<{failure?: string; stderr: string}>((resolve) => {
    execFile(bwrap, [...namespaceOptions(), '--', '/bin/true'], {timeout: PROBE_TIMEOUT_MS, env: {}, encoding: 'utf8'}, (error, _stdout, stderr) => {
      const failure = !error ? undefined : error.killed ? 'timed out after 10 s' : typeof error.code === 'number' ? `exit ${error.code}` : error.message
      resolve({failure, stderr: String(stderr ?? '')})
    })
  })
  return probeResult(bwrap, result.failure, result.stderr)
}

function probeResult(bwrap: string, failure: string | undefined, stderr: string): NamespaceProbe {
  if (failure === undefined) return {available: true, bwrap}
  const firstLine = stderr.trim().split('\n')[0] ?? ''
  return {available: false, bwrap, reason: `bubblewrap cannot create the namespaces: ${firstLine || failure} (unprivileged user namespaces disabled?)`}
}

function isExecutable(file: string): boolean {
  try {
    fs.accessSync(file, fs.constants.X_OK)
    return true
  } catch {
    return false
  }
}

/**
 * --die-with-parent: bwrap and everything in the sandbox get SIGKILL when the gateway's process dies;
 * --unshare-pid: bwrap is init of the run's PID namespace, so when it dies the kernel kills every
 * process left in it. --disable-userns: no nested user namespace (where covers could be unmounted).
 */
function namespaceOptions(): string[] {
  return [
    '--unshare-user',
    '--disable-userns',
    '--unshare-pid',
    '--unshare-ipc',
    '--die-with-parent',
    '--bind', '/', '/',
    '--proc', '/proc',
    '--dev', '/dev',
  ]
}

/**
 * The source of every file cover: an empty mode-000 file in MEEPAGATEWAY_HOME (which no agent can
 * reach), recreated whenever it is anything else.
 */
export function emptyCoverFile(home: string): string {
  const file = path.join(home, 'sandbox-empty-file')
  if (isEmptyCover(file)) return file
  fs.rmSync(file, {force: true, recursive: true})
  fs.mkdirSync(home, {recursive: true, mode: 0o700})
  try {
    fs.closeSync(fs.openSync(file, fs.constants.O_CREAT | fs.constants.O_EXCL | fs.constants.O_WRONLY | fs.constants.O_NOFOLLOW, 0))
  } catch (error) {
    // a run started at the same moment made it first
    if ((error as NodeJS.ErrnoException).code === 'EEXIST' && isEmptyCover(file)) return file
    throw error
  }
  return file
}

function isEmptyCover(file: string): boolean {
  try {
    const stat = fs.lstatSync(file)
    return stat.isFile() && stat.size === 0 && (stat.mode & 0o7777) === 0 && stat.uid === process.getuid?.()
  } catch {
    return false
  }
}

/** argv prefix that starts the rest of argv inside the namespaces, with the policy's covers mounted. */
export function bwrapArgv(bwrap: string, policy: Pick<SandboxPolicy, 'covered'>, home: string): string[] {
  const covers: string[] = []
  const emptyFile = policy.covered.some((cover) => cover.kind === 'file') ? emptyCoverFile(home) : undefined
  for (const cover of policy.covered) {
    if (cover.kind === 'dir') covers.push('--perms', '0000', '--tmpfs', cover.path, '--remount-ro', cover.path)
    else covers.push('--ro-bind', emptyFile!, cover.path)
  }
  return [bwrap, ...namespaceOptions(), ...covers, '--']
}
