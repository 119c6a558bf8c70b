import fs from 'node:fs'
import path from 'node:path'
import {GatewayError} from '../util/errors.js'
import {makeHomeDirectories} from '../util/make-directories.js'
import {startSubprocess} from '../util/subprocess.js'
import {workspacePath} from './location.js'
import {withHomeLock} from './agent-lock.js'

/**
 * limits.disk held by the kernel: under a root gateway each workspace is a filesystem of its own,
 * an ext4 image of exactly limits.disk (space reserved with fallocate, so a full host disk cannot
 * fail it later) loop-mounted `nosuid,nodev` on the workspace directory. A write past it fails
 * with ENOSPC whoever makes it and however (many files, deep trees, hardlinks, fallocate), at
 * every level: bubblewrap and Docker bind the workspace path, and a bind of a mount point binds
 * the mount. The image lives in the gateway's home (`volumes/`), out of every run's reach.
 *
 * The mount lives in the host's mount namespace, so it outlives the gateway; after a reboot the
 * next run (or `agent create`, or a standby) mounts it again before anything writes to the
 * workspace. A workspace holding files while its image is not mounted is refused, never written:
 * those files would be hidden by the mount. A larger limit grows the filesystem online; a smaller
 * one shrinks it the next time it is mounted, if the files fit (until then the measurement holds
 * the lower limit). Without root (or loop devices, or e2fsprogs) the limit is measured instead
 * (run-lifecycle/disk-limit.ts).
 */

const TOOL_PATH = '/usr/sbin:/usr/bin:/sbin:/bin'
/** mkfs, fsck and resize of an image are bounded by its size; a minute is ample for gigabytes. */
const TOOL_TIMEOUT_MS = 60_000
/** Moving an existing workspace into its new volume copies every file once. */
const COPY_TIMEOUT_MS = 10 * 60_000
/** Below this a journal would take most of the space (ext4's smallest is 4 MiB). */
const JOURNAL_FROM_BYTES = 256 * 1024 ** 2
/** How long an unmounted image's loop device may take to be released before it counts as held elsewhere. */
const LOOP_RELEASE_MS = 2000
/** The smallest filesystem worth making; a smaller limits.disk stays measured. */
export const MIN_VOLUME_BYTES = 1024 ** 2

/** Why workspaces cannot be volumes on this host (undefined: they can). */
export function volumeUnavailable(): string | undefined {
  if (process.platform !== 'linux') return 'not Linux'
  if (process.getuid?.() !== 0) return 'the gateway is not root (mounting a filesystem needs root)'
  if (!inInitialUserNamespace())
    return 'the gateway is root only inside a user namespace (mounting a loop device needs the host root)'
  if (!fs.existsSync('/dev/loop-control')) return 'this host has no loop devices (/dev/loop-control)'
  if (!toolPath('mkfs.ext4')) return 'mkfs.ext4 is not installed (Debian: apt-get install e2fsprogs)'
  return undefined
}

/** uid 0 mapped to the host's uid 0 over the whole range: not a user namespace's own root. */
function inInitialUserNamespace(): boolean {
  try {
    const map = fs.readFileSync('/proc/self/uid_map', 'utf8').trim().split(/\s+/)
    return map[0] === '0' && map[1] === '0' && map[2] === '4294967295'
  } catch {
    return false
  }
}

/** Where an agent's workspace image lives: in the home, never inside a workspace. */
export function volumeImagePath(home: string, id: string): string {
  return path.join(home, 'volumes', `${id}.ext4`)
}

/** The filesystem mounted exactly at `dir`, from this process's mount table (undefined: none). */
export function mountedAt(dir: string): {source: string; fstype: string} | undefined {
  let table: string
  try {
    table = fs.readFileSync('/proc/self/mountinfo', 'utf8')
  } catch {
    return undefined
  }
  let real = dir
  try {
    real = fs.realpathSync(dir) // the table names real paths: a home below a symlink still matches
  } catch {
    // not there (yet): nothing is mounted on it
  }
  let found: {source: string; fstype: string} | undefined
  for (const line of table.split('\n')) {
    const [before, after] = line.split(' - ')
    const mountPoint = before?.split(' ')[4]
    if (!after || mountPoint === undefined || unescapeMount(mountPoint) !== real) continue
    const [fstype = '', source = ''] = after.split(' ')
    found = {source: unescapeMount(source), fstype} // the last one listed is the one on top
  }
  return found
}

/**
 * Bytes in use on `workspace` when it is the gateway's volume for it (undefined otherwise): the
 * filesystem's own count, exact and immediate, where a walk of a huge tree takes seconds of CPU.
 */
export async function volumeUsedBytes(workspace: string): Promise<number | undefined> {
  const mounted = mountedAt(workspace)
  const image = path.join(path.dirname(path.dirname(workspace)), 'volumes', `${path.basename(workspace)}.ext4`)
  if (!mounted || loopBackingFile(mounted.source) !== image) return undefined
  const stat = await fs.promises.statfs(workspace)
  return (stat.blocks - stat.bfree) * stat.bsize
}

/** The file behind a loop device (undefined: not a loop device, or detached). */
function loopBackingFile(device: string): string | undefined {
  const name = path.basename(device)
  if (!/^loop\d+$/.test(name)) return undefined
  try {
    return fs.readFileSync(`/sys/block/${name}/loop/backing_file`, 'utf8').trim()
  } catch {
    return undefined
  }
}

/** One volume operation per workspace at a time. */
const pending = new Map<string, Promise<unknown>>()

/**
 * Makes sure the agent's workspace is its volume of `limitBytes` before anything writes to it:
 * made (and an existing workspace's files moved in) the first time, mounted again after a reboot,
 * grown when the limit grew. Does nothing where volumes are unavailable (see volumeUnavailable).
 * Throws E_DISK when the workspace cannot be its volume, naming why and the fix.
 */
export async function ensureWorkspaceVolume(home: string, id: string, limitBytes: number): Promise<void> {
  if (volumeUnavailable() !== undefined || limitBytes < MIN_VOLUME_BYTES) return
  const workspace = workspacePath(home, id)
  // every message and standby comes here: a volume that is ready needs no lock file written
  if (!pending.has(workspace) && readyVolume(home, id, workspace, roundDown(limitBytes))) return
  const before = pending.get(workspace) ?? Promise.resolve()
  // in this process one after another; across processes (two `send`s to a new agent) under a lock file
  const next = before
    .catch(() => {})
    .then(() => withHomeLock(home, `volume-${id}`, id, () => mountVolume(home, id, workspace, roundDown(limitBytes))))
  pending.set(workspace, next)
  try {
    await next
  } finally {
    if (pending.get(workspace) === next) pending.delete(workspace)
  }
}

/** The workspace is its volume, mounted, at least `sizeBytes`, and no move of its files was left half done. */
function readyVolume(home: string, id: string, workspace: string, sizeBytes: number): boolean {
  const image = volumeImagePath(home, id)
  const mounted = mountedAt(workspace)
  if (!mounted || loopBackingFile(mounted.source) !== image) return false
  if ([`${workspace}.moving`, `${workspace}.moved`].some((leftover) => fs.existsSync(leftover))) return false
  return fs.statSync(image).size >= sizeBytes
}

async function mountVolume(home: string, id: string, workspace: string, sizeBytes: number): Promise<void> {
  const image = volumeImagePath(home, id)
  const moving = `${workspace}.moving`
  const moved = `${workspace}.moved`
  if (fs.existsSync(moving)) await undoMove(workspace, moving, image)
  if (fs.existsSync(moved)) await removeOld(moved)
  const mounted = mountedAt(workspace)
  if (mounted) {
    if (loopBackingFile(mounted.source) === image && fs.statSync(image).size < sizeBytes)
      await growMounted(image, workspace, mounted.source, sizeBytes)
    return // a filesystem the operator mounted there is theirs: the measurement still holds the limit
  }
  makeHomeDirectories(path.dirname(image), home)
  makeHomeDirectories(path.dirname(workspace), home)
  const held = entriesOf(workspace)
  if (fs.existsSync(image)) {
    if (held !== undefined && held.length > 0)
      throw volumeError(
        `the workspace ${workspace} holds files (${held.slice(0, 3).join(', ')}) while its volume ${image} is not mounted; mounting would hide them`,
        [
          `move them into the volume: mount -o loop,nosuid,nodev ${image} /mnt, move the files there, umount /mnt`,
          `or remove them from ${workspace}`,
        ],
      )
    if (fs.statSync(image).size > sizeBytes) await shrinkUnmounted(image, sizeBytes)
    if (held === undefined) fs.mkdirSync(workspace, {mode: 0o700})
    await mount(image, workspace)
    return
  }
  await makeImage(image, sizeBytes)
  if (held === undefined || held.length === 0) {
    if (held === undefined) fs.mkdirSync(workspace, {mode: 0o700})
    const owner = fs.statSync(workspace)
    await mount(image, workspace)
    settleRoot(workspace, owner)
    return
  }
  await moveIntoVolume(workspace, moving, image)
  fs.renameSync(moving, moved) // the copy is whole: from here a crash only leaves the old files to remove
  await removeOld(moved)
}

async function removeOld(dir: string): Promise<void> {
  const removed = await tool('rm', ['-rf', '--one-file-system', '--', dir], COPY_TIMEOUT_MS)
  if (removed.failed)
    throw volumeError(`cannot remove ${dir} after moving its files into the volume: ${removed.reason}`, [
      `remove ${dir}`,
    ])
}

/** A workspace that already has files: it is renamed aside, its files copied into the new volume, then removed. */
async function moveIntoVolume(workspace: string, moving: string, image: string): Promise<void> {
  const owner = fs.statSync(workspace)
  fs.renameSync(workspace, moving)
  fs.mkdirSync(workspace, {mode: 0o700})
  try {
    await mount(image, workspace)
    settleRoot(workspace, owner)
    const copied = await tool('cp', ['-a', '--', `${moving}/.`, `${workspace}/`], COPY_TIMEOUT_MS)
    if (copied.failed)
      throw volumeError(
        `the files of ${workspace} do not fit its limits.disk (${mebibytes(fs.statSync(image).size)}), so it cannot become a volume of that size: ${copied.reason}`,
        [`remove files from ${workspace}`, 'or raise limits.disk for this agent'],
      )
  } catch (error) {
    await undoMove(workspace, moving, image)
    throw error
  }
}

/** Back to before moveIntoVolume (a failed copy, or a crash during one): the files in place, no image. */
async function undoMove(workspace: string, moving: string, image: string): Promise<void> {
  if (mountedAt(workspace)) await tool('umount', [workspace], TOOL_TIMEOUT_MS)
  if (mountedAt(workspace))
    throw volumeError(`cannot unmount the half-made volume at ${workspace}`, [`umount ${workspace} and try again`])
  if (fs.existsSync(workspace)) fs.rmdirSync(workspace) // the empty mount point: anything in it is not removed
  fs.renameSync(moving, workspace)
  fs.rmSync(image, {force: true})
}

/** The new filesystem's root takes the workspace directory's owner and mode; mkfs's lost+found is not the agent's. */
function settleRoot(workspace: string, owner: fs.Stats): void {
  fs.chownSync(workspace, owner.uid, owner.gid)
  fs.chmodSync(workspace, owner.mode & 0o7777)
  fs.rmSync(path.join(workspace, 'lost+found'), {recursive: true, force: true})
}

async function makeImage(image: string, sizeBytes: number): Promise<void> {
  const temp = `${image}.new`
  fs.rmSync(temp, {force: true})
  try {
    const reserved = await tool('fallocate', ['-l', String(sizeBytes), temp], TOOL_TIMEOUT_MS)
    if (reserved.failed)
      throw volumeError(
        `cannot reserve limits.disk (${mebibytes(sizeBytes)}) for the workspace volume ${image}: ${reserved.reason}`,
        [`free space on the filesystem of ${path.dirname(image)}`, 'or lower limits.disk for this agent'],
      )
    // no journal below JOURNAL_FROM_BYTES: it would eat most of a small limit; fsck runs before each mount instead
    const journal = sizeBytes >= JOURNAL_FROM_BYTES ? [] : ['-O', '^has_journal']
    const made = await tool('mkfs.ext4', ['-q', '-F', '-m', '0', '-E', 'nodiscard', ...journal, temp], TOOL_TIMEOUT_MS)
    if (made.failed) throw volumeError(`cannot make the workspace volume ${image}: ${made.reason}`, [])
    fs.chmodSync(temp, 0o600)
    fs.renameSync(temp, image)
  } finally {
    fs.rmSync(temp, {force: true})
  }
}

async function mount(image: string, workspace: string): Promise<void> {
  // mounted elsewhere still (a standby's namespace), mount reuses its loop device: nothing to check
  if (!(await stillInUse(image))) {
    // a journal-less image after a crash needs its check; a clean one passes in milliseconds
    const checked = await tool('e2fsck', ['-p', image], TOOL_TIMEOUT_MS)
    if (checked.failed && checked.exitCode !== 1)
      throw volumeError(`the workspace volume ${image} is damaged: ${checked.reason}`, [`run e2fsck ${image}`])
    // an image grown while mounted (growMounted) gets its filesystem grown here; a no-op otherwise
    await tool('resize2fs', [image], TOOL_TIMEOUT_MS)
  }
  const mounted = await tool(
    'mount',
    ['-t', 'ext4', '-o', 'loop,nosuid,nodev,noatime', image, workspace],
    TOOL_TIMEOUT_MS,
  )
  if (mounted.failed)
    throw volumeError(`cannot mount the workspace volume ${image} on ${workspace}: ${mounted.reason}`, [
      `check that ${workspace} is an empty directory and nothing else is mounted there`,
    ])
}

/**
 * Grows a mounted volume to a raised limit: online where the kernel lets us (CAP_SYS_RESOURCE),
 * else unmounted and grown, unless it is mounted elsewhere too (a standby's namespace): then it
 * keeps its size until the next mount, stricter than the limit, never looser.
 */
async function growMounted(image: string, workspace: string, device: string, sizeBytes: number): Promise<void> {
  const reserved = await tool('fallocate', ['-l', String(sizeBytes), image], TOOL_TIMEOUT_MS)
  if (reserved.failed)
    throw volumeError(`cannot grow the workspace volume ${image} to ${mebibytes(sizeBytes)}: ${reserved.reason}`, [
      `free space on the filesystem of ${path.dirname(image)}`,
      'or lower limits.disk for this agent',
    ])
  if (!(await tool('losetup', ['-c', device], TOOL_TIMEOUT_MS)).failed)
    if (!(await tool('resize2fs', [device], TOOL_TIMEOUT_MS)).failed) return
  if ((await tool('umount', [workspace], TOOL_TIMEOUT_MS)).failed) return
  await mount(image, workspace) // grown first when nothing else holds it (see mount)
}

/** Shrinks an image nothing holds to a lowered limit; files that do not fit leave it as it is (the measurement refuses the runs). */
async function shrinkUnmounted(image: string, sizeBytes: number): Promise<void> {
  if (await stillInUse(image)) return
  await tool('e2fsck', ['-f', '-p', image], TOOL_TIMEOUT_MS)
  const resized = await tool('resize2fs', [image, `${sizeBytes / 1024}K`], TOOL_TIMEOUT_MS)
  if (!resized.failed) fs.truncateSync(image, sizeBytes)
}

/** The kernel frees an unmounted loop device a moment later (autoclear): in use only if it stays held. */
async function stillInUse(image: string): Promise<boolean> {
  for (let waited = 0; waited < LOOP_RELEASE_MS; waited += 50) {
    if (!imageInUse(image)) return false
    await new Promise((resolve) => setTimeout(resolve, 50))
  }
  return imageInUse(image)
}

/**
 * Whether a loop device still holds the image: mounted in another mount namespace (a standby's)
 * after this one unmounted it. Such a live filesystem is never checked or resized from here.
 */
function imageInUse(image: string): boolean {
  let devices: string[]
  try {
    devices = fs.readdirSync('/sys/block').filter((name) => /^loop\d+$/.test(name))
  } catch {
    return true // cannot tell: treat it as live
  }
  return devices.some((name) => loopBackingFile(`/dev/${name}`) === image)
}

/** The names in `dir` (undefined: no such directory). */
function entriesOf(dir: string): string[] | undefined {
  try {
    return fs.readdirSync(dir)
  } catch (error) {
    if ((error as NodeJS.ErrnoException).code === 'ENOENT') return undefined
    throw error
  }
}

function toolPath(name: string): string | undefined {
  return TOOL_PATH.split(':')
    .map((dir) => path.join(dir, name))
    .find((file) => fs.existsSync(file))
}

async function tool(
  command: string,
  args: string[],
  timeoutMs: number,
): Promise<{failed: boolean; exitCode?: number; reason: string}> {
  const result = await startSubprocess(toolPath(command) ?? command, args, {env: {PATH: TOOL_PATH}, timeoutMs})
  const said = result.stderr.trim().split('\n').slice(-2).join('; ')
  return {failed: result.failed, exitCode: result.exitCode, reason: said || result.message}
}

function volumeError(message: string, suggestions: string[]): GatewayError {
  return new GatewayError('E_DISK', message, {suggestions})
}

function roundDown(bytes: number): number {
  return Math.floor(bytes / 4096) * 4096
}

function mebibytes(bytes: number): string {
  return `${(bytes / 1024 ** 2).toFixed(1)} MiB`
}

/** mountinfo escapes space, tab, newline and backslash as octal. */
function unescapeMount(field: string): string {
  return field.replace(/\\([0-7]{3})/g, (_, octal: string) => String.fromCharCode(parseInt(octal, 8)))
}
