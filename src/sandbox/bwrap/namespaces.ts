import fs from 'node:fs'
import path from 'node:path'
import type {SandboxPolicy} from '../policy.js'
import {isWithin} from '../paths.js'
import {forget, recalled, remember} from '../../runtime/util/remembered.js'
import {bootId, fileIdentity, PROBE_RECORD, readSmallFile} from '../probe-record.js'
import {makeHomeDirectories} from '../../runtime/util/make-directories.js'

/**
 * The namespace layer of the host sandbox: bubblewrap (the tool Flatpak, codex and Anthropic's
 * sandbox-runtime use) starts the helper in new user, mount, PID and IPC namespaces. There, denied
 * entries inside a grant are covered by mounts (so Landlock can give their parent full rights), /proc
 * shows the run's own processes only and /dev/pts is a private instance. Order of the layers:
 * bwrap -> meepa-sandbox (Landlock + seccomp) -> the command, so Landlock applies inside.
 *
 * The host's `/` is bound read-only and only the read-write grants are bound writable over it:
 * Landlock has no right for chmod, chown, utimes, xattrs or attribute flags, so outside the grants
 * the read-only mount is what refuses them (EROFS), for a root gateway's uid 0 too. Every bind is
 * nosuid,nodev (bubblewrap's own default).
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
const USERNS_SYSCTLS = [
  '/proc/sys/user/max_user_namespaces',
  '/proc/sys/kernel/unprivileged_userns_clone',
  '/proc/sys/kernel/apparmor_restrict_unprivileged_userns',
]

async function probeOrRecall(cacheFile: string | undefined): Promise<NamespaceProbe> {
  const bwrap = findBwrap()
  if (!bwrap) return NO_BWRAP
  const identity = cacheFile ? fileIdentity(bwrap) : undefined
  const key =
    identity && JSON.stringify([process.getuid?.(), bwrap, ...identity, bootId(), ...USERNS_SYSCTLS.map(readSmallFile)])
  if (cacheFile && key && recalled<boolean>(cacheFile, key, PROBE_RECORD) === true)
    return {available: true, bwrap, recalled: true}
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
  if (process.platform !== 'linux')
    return {available: false, reason: `namespaces are Linux only (this is ${process.platform})`}
  if (process.env[NO_NAMESPACES_ENV]) return {available: false, reason: `disabled by ${NO_NAMESPACES_ENV}`}
  return undefined
}

const findBwrap = () => BWRAP_CANDIDATES.find((candidate) => isExecutable(candidate))

async function runProbe(bwrap: string): Promise<NamespaceProbe> {
  const {bwrapFailure} = await import('./bwrap-probe.js')
  const failure = await bwrapFailure(bwrap, [...namespaceOptions(), '--', '/bin/true'], PROBE_TIMEOUT_MS)
  if (failure === undefined) return {available: true, bwrap}
  return {
    available: false,
    bwrap,
    reason: `bubblewrap cannot create the namespaces: ${failure} (unprivileged user namespaces disabled?)`,
  }
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
 * process left in it. No nested user namespace: the helper's seccomp filter refuses clone and
 * unshare with CLONE_NEWUSER (bubblewrap's --disable-userns would put the helper in a nested user
 * namespace that does not own the mounts it must make read-only).
 */
function namespaceOptions(): string[] {
  return [
    '--unshare-user',
    '--unshare-pid',
    '--unshare-ipc',
    '--die-with-parent',
    '--ro-bind',
    '/',
    '/',
    '--proc',
    '/proc',
    '--dev',
    '/dev',
  ]
}

/** The host device nodes bubblewrap's `--dev` binds into the run's private /dev (its own list). */
export const BWRAP_DEVICES = ['/dev/null', '/dev/zero', '/dev/full', '/dev/random', '/dev/urandom', '/dev/tty'] as const
/** What `--dev` makes of its own: the run's devpts and the nodes above (a granted /dev/shm is the host's). */
const PRIVATE_DEV = new Set<string>(['/dev', '/dev/pts', ...BWRAP_DEVICES])
const isRoot = () => process.getuid?.() === 0

/**
 * Mounts the helper makes read-only inside the namespace (the rules' `remount_ro`), keeping device
 * access: the host's device nodes, whose inodes a root gateway's run owns (a writable bind would let
 * it chmod the host's /dev/null), and granted read-only paths under /dev, which need a device bind.
 */
export function namespaceRemounts(policy: Pick<SandboxPolicy, 'grants'>): string[] {
  const devices = isRoot() ? BWRAP_DEVICES.filter((device) => fs.existsSync(device)) : []
  return [
    ...devices,
    ...devGrants(policy)
      .filter((grant) => grant.access !== 'read-write')
      .map((grant) => grant.path),
  ]
}

/** Grants under /dev that the private /dev does not provide: bound from the host (the Codex suite's /dev/shm). */
function devGrants(policy: Pick<SandboxPolicy, 'grants'>) {
  return policy.grants.filter((grant) => isWithin(grant.path, '/dev') && !PRIVATE_DEV.has(grant.path))
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
    fs.closeSync(
      fs.openSync(
        file,
        fs.constants.O_CREAT | fs.constants.O_EXCL | fs.constants.O_WRONLY | fs.constants.O_NOFOLLOW,
        0,
      ),
    )
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

/**
 * The run's TMPDIR as a tmpfs of the run's mount namespace, `bytes` large (limits.disk): whatever
 * the run leaves in it, however deep, goes with the namespace, and nothing of it reaches the host's
 * disk. Its pages count toward the run's memory limit (tmpfs is memory).
 */
export interface PrivateTmp {
  path: string
  bytes: number
}

/**
 * argv prefix that starts the rest of argv inside the namespaces: the read-write grants bound
 * writable (parents first), granted paths under /dev bound into the private /dev, then the
 * policy's covers. CAP_SYS_ADMIN in the run's user namespace lets the helper make its
 * `remount_ro` mounts read-only (a root gateway's bwrap keeps every capability already); the
 * helper drops it with the others before anything of the run executes.
 */
export function bwrapArgv(
  bwrap: string,
  policy: Pick<SandboxPolicy, 'covered' | 'grants'>,
  home: string,
  privateTmp?: PrivateTmp,
): string[] {
  const binds: string[] = []
  const byDepth = [...policy.grants].sort((a, b) => a.path.length - b.path.length)
  const tmp = privateTmp && fs.realpathSync(privateTmp.path)
  for (const grant of byDepth) {
    if (isWithin(grant.path, '/dev')) continue
    if (grant.path === tmp) binds.push('--perms', '0700', '--size', String(privateTmp!.bytes), '--tmpfs', grant.path)
    else if (grant.access === 'read-write' && !isWithin(grant.path, '/proc'))
      binds.push('--bind', grant.path, grant.path)
  }
  for (const grant of devGrants({grants: byDepth})) binds.push('--dev-bind', grant.path, grant.path)
  const capabilities = !isRoot() && namespaceRemounts(policy).length > 0 ? ['--cap-add', 'CAP_SYS_ADMIN'] : []
  const covers: string[] = []
  const emptyFile = policy.covered.some((cover) => cover.kind === 'file') ? emptyCoverFile(home) : undefined
  for (const cover of policy.covered) {
    if (cover.kind === 'dir') covers.push('--perms', '0000', '--tmpfs', cover.path, '--remount-ro', cover.path)
    else covers.push('--ro-bind', emptyFile!, cover.path)
  }
  return [bwrap, ...namespaceOptions(), ...capabilities, ...binds, ...covers, '--']
}
