import fs from 'node:fs'
import path from 'node:path'
import type {SandboxPolicy} from '../policy.js'
import {forget, recalled, remember} from '../../runtime/util/remembered.js'
import {bootId, fileIdentity, PROBE_RECORD, readSmallFile} from '../probe-record.js'
import {makeHomeDirectories} from '../../runtime/util/make-directories.js'

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
  /** The answer is a success remembered by an earlier process, not a probe of this one. */
  recalled?: boolean
}

/** Test hook: makes the layer look unavailable (it can only weaken what the sandbox gets, and says so). */
export const NO_NAMESPACES_ENV = 'MEEPA_SANDBOX_NO_NAMESPACES'

const BWRAP_CANDIDATES = ['/usr/bin/bwrap', '/usr/local/bin/bwrap', '/bin/bwrap']

let cached: {probe: Promise<NamespaceProbe>; at: number} | undefined
/** A failed probe is tried again after this long: one slow start under load must not cost the layer for good. */
const RETRY_FAILED_PROBE_MS = 60_000

/**
 * Whether bubblewrap can create the namespaces on this machine: tried with the real options, once
 * per process while it works. With `cacheFile` (in MEEPAGATEWAY_HOME), a success is remembered
 * across processes (a CLI start then neither runs bwrap nor loads node:child_process for it).
 */
export async function probeNamespaces(options: {cacheFile?: string} = {}): Promise<NamespaceProbe> {
  const refused = probeRefused()
  if (refused) return refused
  if (cached && !(await cached.probe).available && Date.now() - cached.at > RETRY_FAILED_PROBE_MS) cached = undefined
  cached ??= {probe: probeOrRecall(options.cacheFile), at: Date.now()}
  return cached.probe
}

/**
 * The remembered success is only trusted for the same boot, user, bwrap binary and user-namespace
 * sysctls (probe-record.ts: and for an hour). Only a success is remembered, so a wrong record can
 * only claim the layer: the run then fails in bwrap (closed), it never runs with less than the
 * probe would have given.
 */
const USERNS_SYSCTLS = ['/proc/sys/user/max_user_namespaces', '/proc/sys/kernel/unprivileged_userns_clone', '/proc/sys/kernel/apparmor_restrict_unprivileged_userns']

async function probeOrRecall(cacheFile: string | undefined): Promise<NamespaceProbe> {
  const bwrap = findBwrap()
  if (!bwrap) return NO_BWRAP
  const identity = cacheFile ? fileIdentity(bwrap) : undefined
  const key = identity && JSON.stringify([process.getuid?.(), bwrap, ...identity, bootId(), ...USERNS_SYSCTLS.map(readSmallFile)])
  if (cacheFile && key && recalled<boolean>(cacheFile, key, PROBE_RECORD) === true) return {available: true, bwrap, recalled: true}
  const probe = await runProbe(bwrap)
  if (probe.available && cacheFile && key) remember(cacheFile, key, true)
  return probe
}

/**
 * After a start behind bwrap failed (exit 1, bwrap's own failure status): whether that was a
 * remembered success gone out of date (bwrap stopped working with the key unchanged: a nested
 * user-namespace limit, an AppArmor profile). Then the record is forgotten and the layer probed
 * again, and the caller starts again with what the probe finds: nothing ran the first time.
 */
export async function rememberedLayerBroke(probe: NamespaceProbe, cacheFile: string): Promise<boolean> {
  if (!probe.recalled) return false
  forget(cacheFile)
  cached = undefined
  return !(await probeNamespaces({cacheFile})).available
}

const PROBE_TIMEOUT_MS = 10_000
const NO_BWRAP: NamespaceProbe = {available: false, reason: 'bubblewrap is not installed (apt-get install bubblewrap)'}

function probeRefused(): NamespaceProbe | undefined {
  if (process.platform !== 'linux') return {available: false, reason: `namespaces are Linux only (this is ${process.platform})`}
  if (process.env[NO_NAMESPACES_ENV]) return {available: false, reason: `disabled by ${NO_NAMESPACES_ENV}`}
  return undefined
}

const findBwrap = () => BWRAP_CANDIDATES.find((candidate) => isExecutable(candidate))

async function runProbe(bwrap: string): Promise<NamespaceProbe> {
  const {bwrapFailure} = await import('./bwrap-probe.js')
  const failure = await bwrapFailure(bwrap, [...namespaceOptions(), '--', '/bin/true'], PROBE_TIMEOUT_MS)
  if (failure === undefined) return {available: true, bwrap}
  return {available: false, bwrap, reason: `bubblewrap cannot create the namespaces: ${failure} (unprivileged user namespaces disabled?)`}
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
  makeHomeDirectories(home, home)
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
