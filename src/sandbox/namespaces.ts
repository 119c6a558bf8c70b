import {execFile, spawn} from 'node:child_process'
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
  const argv = [...namespaceOptions(), '--', '/bin/true']
  // no pipes (a third of the CPU of execFile's, whose streams a CLI start pays for): bwrap's own
  // message is only needed when it fails, and is read by running it once more then
  const failure = await new Promise<string | undefined>((resolve) => {
    const child = spawn(bwrap, argv, {env: {}, stdio: 'ignore'})
    const deadline = setTimeout(() => {
      child.kill('SIGKILL')
      resolve('timed out after 10 s')
    }, PROBE_TIMEOUT_MS)
    child.on('error', (error) => {
      clearTimeout(deadline)
      resolve(error.message)
    })
    child.on('exit', (code, signal) => {
      clearTimeout(deadline)
      resolve(code === 0 ? undefined : code === null ? `killed by ${signal}` : `exit ${code}`)
    })
  })
  if (failure === undefined) return probeResult(bwrap, undefined, '')
  const again = await new Promise<string>((resolve) => {
    execFile(bwrap, argv, {timeout: PROBE_TIMEOUT_MS, env: {}, encoding: 'utf8'}, (_error, _stdout, stderr) => resolve(String(stderr ?? '')))
  })
  return probeResult(bwrap, failure, again)
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
