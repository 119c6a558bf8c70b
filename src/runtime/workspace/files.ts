import fs from 'node:fs'
import path from 'node:path'
import {errorCode, GatewayError} from '../util/errors.js'
import {randomHex} from '../util/random.js'
import {copyFileRange, copyFileRangeInTurns, type FileRange} from '../util/spooled-bytes.js'

/**
 * Files the gateway process itself reads or writes inside an agent's workspace (SOUL.md,
 * MEMORY.md, skills, memory.db). The agent owns that directory and may have planted anything in
 * it: a symlink to /proc/self/environ or ~/.ssh, a FIFO that blocks a reader forever, a device
 * node, a symlinked parent directory. So nothing below the workspace root is followed: every
 * component is lstat'ed, the file is opened with O_NOFOLLOW|O_NONBLOCK, must be a regular file
 * of bounded size, and after opening its identity and real path are compared with what was checked.
 */

/** Bigger workspace files are refused: the gateway puts them in memory and in API answers. */
export const MAX_WORKSPACE_FILE_BYTES = 1024 * 1024

const {O_RDONLY, O_WRONLY, O_CREAT, O_EXCL, O_NOFOLLOW, O_NONBLOCK, O_DIRECTORY} = fs.constants

/**
 * The writer's deliberate refusal: an entry it does not follow, open or write over (a link, a
 * folder, a FIFO where a file would go; a parent that is not a folder). Anything else it throws is
 * the host failing to do what it should (a full disk, a name too long for its filesystem, a
 * permission), which a caller must not take for a refusal.
 */
export class WorkspaceRefusal extends GatewayError {}

function refuse(relative: string, problem: string): WorkspaceRefusal {
  return new WorkspaceRefusal(
    'E_WORKSPACE',
    `the workspace's ${relative} ${problem}; the gateway does not follow or open anything but regular files there`,
    {
      suggestions: [`replace ${relative} with a regular file (e.g. delete it; the gateway recreates its own files)`],
    },
  )
}

function kindOf(stat: fs.Stats): string {
  if (stat.isSymbolicLink()) return 'a symbolic link'
  if (stat.isFIFO()) return 'a FIFO'
  if (stat.isCharacterDevice() || stat.isBlockDevice()) return 'a device node'
  if (stat.isSocket()) return 'a socket'
  if (stat.isDirectory()) return 'a directory'
  return 'not a regular file'
}

/** `SOUL.md`, `skills/x/SKILL.md`; never absolute, never `..`. */
function partsOf(relative: string): string[] {
  const parts = relative.split(/[\\/]+/).filter((part) => part && part !== '.')
  if (path.isAbsolute(relative) || parts.length === 0 || parts.includes('..')) {
    throw new GatewayError('E_INPUT', `${JSON.stringify(relative)} is not a path inside the workspace`)
  }
  return parts
}

/**
 * The name of a temporary beside the entry it becomes: hidden, unguessable, and short whatever that
 * entry's name (a name of 255 bytes, the most a folder entry holds, must still get one).
 */
function temporaryName(): string {
  return `.m-${randomHex(8)}.tmp`
}

function lstatOrUndefined(file: string): fs.Stats | undefined {
  try {
    return fs.lstatSync(file)
  } catch (error) {
    if ((error as NodeJS.ErrnoException).code === 'ENOENT') return undefined
    throw error
  }
}

/**
 * The workspace root as the kernel sees it. The root itself may be a link the operator made (its
 * parent, the agents folder, is the operator's, never the agent's): only what is below it is not followed.
 */
function realRoot(root: string): string {
  let stat: fs.Stats
  try {
    stat = fs.statSync(root)
  } catch {
    throw new GatewayError('E_WORKSPACE', `the workspace ${root} does not exist`, {
      suggestions: ['run meepagateway agent create <id>'],
    })
  }
  if (!stat.isDirectory())
    throw new GatewayError('E_WORKSPACE', `the workspace ${root} is ${kindOf(stat)}, not a directory`)
  return fs.realpathSync(root)
}

/**
 * Whom an entry a root gateway adds to the workspace must belong to: the root's owner. A container's
 * workspace is handed over by a walk only when its root has another owner (owner.ts), so a file the
 * gateway leaves as root's there would stay unwritable to the agent (memory.db: its memory).
 * Undefined when nothing needs changing.
 */
function newEntryOwner(root: string): {uid: number; gid: number} | undefined {
  if (process.getuid?.() !== 0) return undefined
  const {uid, gid} = fs.lstatSync(root)
  return uid === 0 && gid === process.getgid?.() ? undefined : {uid, gid}
}

/**
 * Gives what the gateway just made in the workspace to the root's owner; lchown never follows (at
 * worst it re-owns, to the agent, what the agent swapped in).
 */
export function giveToWorkspaceOwner(root: string, entry: string): void {
  const owner = newEntryOwner(root)
  if (owner) fs.lchownSync(entry, owner.uid, owner.gid)
}

/**
 * Checks every directory between the root and the file: each must be a real directory, not a
 * link. `create` makes missing ones (mkdir never follows a link at its last component).
 */
function checkDirectories(root: string, parts: string[], relative: string, create: boolean): string | undefined {
  let current = root
  for (const part of parts.slice(0, -1)) {
    current = path.join(current, part)
    let stat = lstatOrUndefined(current)
    if (!stat && create) {
      fs.mkdirSync(current, {mode: 0o700})
      giveToWorkspaceOwner(root, current)
      stat = fs.lstatSync(current)
    }
    if (!stat) return undefined
    if (!stat.isDirectory())
      throw refuse(relative, `has a parent (${path.relative(root, current)}) that is ${kindOf(stat)}`)
  }
  return current
}

/** Where an open file really is (Linux); undefined where /proc is not available. */
function openedPath(fd: number): string | undefined {
  try {
    return fs.readlinkSync(`/proc/self/fd/${fd}`)
  } catch {
    return undefined
  }
}

function assertOpenedAt(fd: number, expected: string, relative: string): void {
  const actual = openedPath(fd)
  if (actual !== undefined && actual !== expected)
    throw refuse(relative, 'changed while the gateway opened it (a link was swapped in)')
}

/**
 * What is at `relative`, its parents checked without following any (lstat alone follows a link
 * among the parents): undefined when it is missing, or when a parent is missing or is not a folder.
 */
export function lstatWorkspaceEntry(root: string, relative: string): fs.Stats | undefined {
  const parts = partsOf(relative)
  const base = realRoot(root)
  try {
    if (checkDirectories(base, parts, relative, false) === undefined) return undefined
  } catch (error) {
    if (error instanceof GatewayError) return undefined // a parent that is a link, a FIFO, ...
    throw error
  }
  try {
    return lstatOrUndefined(path.join(base, ...parts))
  } catch {
    return undefined // a parent swapped meanwhile
  }
}

/** The file's text, or undefined when it does not exist; E_WORKSPACE for anything but a regular file. */
export function readWorkspaceFile(
  root: string,
  relative: string,
  options: {maxBytes?: number} = {},
): string | undefined {
  const maxBytes = options.maxBytes ?? MAX_WORKSPACE_FILE_BYTES
  const parts = partsOf(relative)
  const base = realRoot(root)
  if (checkDirectories(base, parts, relative, false) === undefined) return undefined
  const file = path.join(base, ...parts)
  const before = lstatOrUndefined(file)
  if (!before) return undefined
  if (!before.isFile()) throw refuse(relative, `is ${kindOf(before)}`)
  let fd: number
  try {
    // O_NONBLOCK: a FIFO swapped in after the lstat cannot block the gateway in open()
    fd = fs.openSync(file, O_RDONLY | O_NOFOLLOW | O_NONBLOCK)
  } catch (error) {
    if ((error as NodeJS.ErrnoException).code === 'ELOOP') throw refuse(relative, 'is a symbolic link')
    if ((error as NodeJS.ErrnoException).code === 'ENOENT') return undefined
    throw error
  }
  try {
    const stat = fs.fstatSync(fd)
    if (!stat.isFile()) throw refuse(relative, `is ${kindOf(stat)}`)
    if (stat.ino !== before.ino || stat.dev !== before.dev)
      throw refuse(relative, 'changed while the gateway opened it')
    // another name for the same file may be anywhere on this file system (gateway.db, another workspace)
    if (stat.nlink > 1)
      throw refuse(relative, `has ${stat.nlink - 1} other hard link(s), so it may be a file from outside the workspace`)
    assertOpenedAt(fd, file, relative)
    if (stat.size > maxBytes) throw refuse(relative, `is larger than ${maxBytes} bytes`)
    const buffer = Buffer.alloc(Math.min(stat.size, maxBytes) + 1)
    let length = 0
    for (;;) {
      const read = fs.readSync(fd, buffer, length, buffer.length - length, null)
      if (read === 0) break
      length += read
      if (length > maxBytes) throw refuse(relative, `is larger than ${maxBytes} bytes`)
    }
    return buffer.subarray(0, length).toString('utf8')
  } finally {
    fs.closeSync(fd)
  }
}

/** How a workspace file is written (writeWorkspaceFile). */
export interface WorkspaceFileOptions {
  mode?: number
  exclusive?: boolean
  written?: (stat: fs.Stats) => void
  /** false: put in place before its bytes are on the disk; the caller fsyncs it later (a take-back's reply first). */
  durable?: false
}

/**
 * Writes the file whole: a new file in the checked directory (O_EXCL|O_NOFOLLOW), then renamed
 * over the old name, which replaces a planted link instead of writing through it. `exclusive`
 * keeps an existing entry (of any kind) and reports false. `written` gets the new file's own
 * stat, taken through its descriptor (what is at the name a moment later may be another's).
 */
export function writeWorkspaceFile(
  root: string,
  relative: string,
  /** The bytes, or where they are in an open file (a spooled change tar: never in memory whole). */
  content: string | Buffer | FileRange,
  options: WorkspaceFileOptions = {},
): boolean {
  const temp = openWorkspaceTemp(root, relative, options)
  if (!temp) return false
  try {
    // a write may take part of it (a disk filling up): the next one then says why it cannot go on
    if (typeof content === 'string' || Buffer.isBuffer(content)) {
      const data = typeof content === 'string' ? Buffer.from(content) : content
      for (let written = 0; written < data.length;)
        written += fs.writeSync(temp.fd, data, written, data.length - written)
    } else copyFileRange(content, temp.fd)
    if (options.durable !== false) fs.fsyncSync(temp.fd)
    return placeWorkspaceTemp(temp, options)
  } finally {
    closeWorkspaceTemp(temp)
  }
}

/**
 * writeWorkspaceFile for bytes in an open file, of any size, without holding the event loop: the
 * copy waits for `turn()` after each piece (see copyFileRangeInTurns) and the fsync runs on
 * libuv's threads. A GiB taken back from an engine held every other agent's reply for seconds.
 */
export async function writeWorkspaceFileInTurns(
  root: string,
  relative: string,
  content: FileRange,
  options: WorkspaceFileOptions & {
    turn: () => Promise<void>
    /** Asked once the bytes are on the disk, just before they are put in place: false leaves the name as it is (returns false). */
    stillWanted?: () => boolean
  },
): Promise<boolean> {
  const temp = openWorkspaceTemp(root, relative, options)
  if (!temp) return false
  try {
    await copyFileRangeInTurns(content, temp.fd, options.turn)
    if (options.durable !== false)
      await new Promise<void>((resolve, reject) => fs.fsync(temp.fd, (error) => (error ? reject(error) : resolve())))
    // the gateway ran other work meanwhile (a SOUL.md saved in the dashboard)
    if (options.stillWanted && !options.stillWanted()) return false
    return placeWorkspaceTemp(temp, options)
  } finally {
    closeWorkspaceTemp(temp)
  }
}

interface WorkspaceTemp {
  fd: number
  temp: string
  file: string
  relative: string
  placed: boolean
}

/** The new file in the checked directory, opened; undefined when `exclusive` finds the name taken. */
function openWorkspaceTemp(root: string, relative: string, options: WorkspaceFileOptions): WorkspaceTemp | undefined {
  const parts = partsOf(relative)
  const base = realRoot(root)
  const dir = checkDirectories(base, parts, relative, true) as string
  const file = path.join(base, ...parts)
  const existing = lstatOrUndefined(file)
  if (existing && options.exclusive) return undefined
  if (existing?.isDirectory()) throw refuse(relative, 'is a directory')
  const temp = path.join(dir, temporaryName())
  const fd = fs.openSync(temp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW, options.mode ?? 0o644)
  const opened: WorkspaceTemp = {fd, temp, file, relative, placed: false}
  try {
    assertOpenedAt(fd, temp, relative)
    const owner = newEntryOwner(base)
    if (owner) fs.fchownSync(fd, owner.uid, owner.gid)
    return opened
  } catch (error) {
    closeWorkspaceTemp(opened)
    throw error
  }
}

/** Puts the written (fsynced unless asked not to) temp file at its name (linked when `exclusive`, else renamed over it). */
function placeWorkspaceTemp(opened: WorkspaceTemp, options: WorkspaceFileOptions): boolean {
  const {fd, temp, file, relative} = opened
  if (options.exclusive) {
    try {
      fs.linkSync(temp, file) // fails on any existing entry, a dangling link included
    } catch (error) {
      if ((error as NodeJS.ErrnoException).code === 'EEXIST') return false
      throw error
    }
    opened.placed = true
    fs.unlinkSync(temp)
    options.written?.(fs.fstatSync(fd))
    return true
  }
  fs.renameSync(temp, file)
  opened.placed = true
  // the open file now has the final name: if a parent had been swapped for a link, it would not
  assertOpenedAt(fd, file, relative)
  options.written?.(fs.fstatSync(fd))
  return true
}

function closeWorkspaceTemp(opened: WorkspaceTemp): void {
  fs.closeSync(opened.fd)
  if (!opened.placed) fs.rmSync(opened.temp, {force: true})
}

/**
 * What is at `relative` without following it: 'missing', 'file', 'directory', or E_WORKSPACE for
 * anything else (for files other code opens by name, e.g. SQLite's memory.db).
 */
export function workspaceEntry(root: string, relative: string): 'missing' | 'file' | 'directory' {
  const parts = partsOf(relative)
  const base = realRoot(root)
  if (checkDirectories(base, parts, relative, false) === undefined) return 'missing'
  const stat = lstatOrUndefined(path.join(base, ...parts))
  if (!stat) return 'missing'
  if (stat.isFile()) return 'file'
  if (stat.isDirectory()) return 'directory'
  throw refuse(relative, `is ${kindOf(stat)}`)
}

/** `report.pdf` → `report-2.pdf`: the next name to try when one is taken. */
function numberedName(name: string, n: number): string {
  if (n === 1) return name
  const dot = name.lastIndexOf('.')
  return dot > 0 ? `${name.slice(0, dot)}-${n}${name.slice(dot)}` : `${name}-${n}`
}

/**
 * Writes a new file from a stream of chunks into `directory` (made when missing, no link followed
 * on the way), never over an existing entry: a taken name (file, link, anything) gets a suffix,
 * `name-2.ext`, `name-3.ext`... The bytes go straight from the chunks to the file, once; it gets
 * its final name (a hard link to an unnamed temp file, O_EXCL|O_NOFOLLOW) only when complete,
 * so a failed stream leaves nothing. Returns the path used, relative to the root, and the size.
 */
export async function writeNewWorkspaceFile(
  root: string,
  directory: string,
  name: string,
  chunks: AsyncIterable<Uint8Array>,
): Promise<{relative: string; size: number}> {
  const relative = `${directory}/${name}`
  const parts = partsOf(relative)
  if (parts.length !== partsOf(directory).length + 1)
    throw new GatewayError('E_INPUT', `${JSON.stringify(name)} is not a file name`)
  const base = realRoot(root)
  const dir = checkDirectories(base, parts, relative, true) as string
  const temp = path.join(dir, `.incoming-${randomHex(8)}.part`)
  const fd = fs.openSync(temp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW, 0o644)
  try {
    assertOpenedAt(fd, temp, relative)
    const owner = newEntryOwner(base)
    if (owner) fs.fchownSync(fd, owner.uid, owner.gid)
    let size = 0
    for await (const chunk of chunks) {
      for (let written = 0; written < chunk.length;) written += fs.writeSync(fd, chunk, written, chunk.length - written)
      size += chunk.length
    }
    for (let n = 1; n <= 1000; n++) {
      const candidate = numberedName(name, n)
      try {
        fs.linkSync(temp, path.join(dir, candidate)) // fails on any existing entry, a dangling link included
      } catch (error) {
        if ((error as NodeJS.ErrnoException).code === 'EEXIST') continue
        throw error
      }
      return {relative: `${path.relative(base, dir)}/${candidate}`, size}
    }
    throw refuse(relative, 'and 999 numbered names beside it are all taken')
  } finally {
    fs.closeSync(fd)
    fs.rmSync(temp, {force: true})
  }
}

/**
 * How reading a file the agent named ended: its bytes, or why it was not read (never thrown):
 * `reason` for the user, `detail` (Node's message: host paths, the agent's names) for the log only.
 */
export type AgentFileRead = {ok: true; data: Buffer} | {ok: false; reason: string; detail?: string; overLimit?: true}

type OpenProblem = {problem: string; detail?: string}

/** `/proc/self/fd/N/name` is openat(N, name): the kernel resolves name inside that directory. */
const DESCRIPTOR_PATHS = fs.existsSync('/proc/self/fd')

function openProblem(error: unknown, what: string): OpenProblem {
  switch ((error as NodeJS.ErrnoException).code) {
    case 'ENOENT':
      return {problem: `${what} does not exist`}
    case 'ELOOP':
      return {problem: `${what} is a symbolic link`}
    case 'ENOTDIR':
      return {problem: `${what} is not a directory`}
    case 'EACCES':
    case 'EPERM':
      return {problem: `the gateway may not read it`}
    default:
      return {problem: `it cannot be opened (${errorCode(error)})`, detail: (error as Error).message}
  }
}

/**
 * Opens `parts` below `base` one component at a time, each relative to its parent's descriptor and
 * with O_NOFOLLOW, so no symbolic link anywhere on the way is followed, however the agent swaps
 * entries meanwhile. The file itself is lstat'ed first (a FIFO or device is never opened) and
 * opened O_NONBLOCK.
 */
function openBeneath(base: string, parts: string[]): {fd: number; before: fs.Stats} | OpenProblem {
  let dir = fs.openSync(base, O_RDONLY | O_DIRECTORY)
  try {
    for (const part of parts.slice(0, -1)) {
      const entry = `/proc/self/fd/${dir}/${part}`
      let next: number
      try {
        next = fs.openSync(entry, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_NONBLOCK)
      } catch (error) {
        // O_DIRECTORY|O_NOFOLLOW answers ENOTDIR for a link: name what is there
        const stat = (error as NodeJS.ErrnoException).code === 'ENOTDIR' ? lstatOrUndefined(entry) : undefined
        return stat ? {problem: `a folder on its path is ${kindOf(stat)}`} : openProblem(error, 'a folder on its path')
      }
      fs.closeSync(dir)
      dir = next
    }
    return openRegularEntry(`/proc/self/fd/${dir}/${parts.at(-1)}`)
  } finally {
    fs.closeSync(dir)
  }
}

/** Where /proc is missing (macOS): every component lstat'ed, then the opened file's identity compared. */
function openByCheckedPath(base: string, parts: string[]): {fd: number; before: fs.Stats} | OpenProblem {
  let current = base
  for (const part of parts.slice(0, -1)) {
    current = path.join(current, part)
    const stat = lstatOrUndefined(current)
    if (!stat) return {problem: 'a folder on its path does not exist'}
    if (!stat.isDirectory()) return {problem: `a folder on its path is ${kindOf(stat)}`}
  }
  return openRegularEntry(path.join(base, ...parts))
}

/** lstat first (a FIFO or device is never opened), then open without following or blocking. */
function openRegularEntry(entry: string): {fd: number; before: fs.Stats} | OpenProblem {
  try {
    const before = fs.lstatSync(entry)
    if (!before.isFile()) return {problem: `it is ${kindOf(before)}`}
    return {fd: fs.openSync(entry, O_RDONLY | O_NOFOLLOW | O_NONBLOCK), before}
  } catch (error) {
    return openProblem(error, 'it')
  }
}

/**
 * Reads a file the agent asked the gateway to send: a regular file below the workspace root, no
 * symbolic link in any component, one name only (a hard link may be a file from outside the
 * workspace: the agent cannot tell us which name is the original), at most `maxBytes`, read once
 * with that bound (a file the agent grows meanwhile is refused, not read without end).
 */
export function readAgentFile(
  root: string,
  relative: string,
  maxBytes: number,
  denied?: (file: string) => boolean,
): AgentFileRead {
  const parts = relative.split(/[\\/]+/).filter((part) => part && part !== '.')
  if (path.isAbsolute(relative) || parts.length === 0 || parts.includes('..'))
    return {ok: false, reason: 'it is not a path inside the workspace'}
  let base: string
  try {
    base = realRoot(root)
  } catch (error) {
    return {ok: false, reason: `the workspace cannot be opened (${errorCode(error)})`, detail: (error as Error).message}
  }
  // no link is followed below the root, so this path is the file's only one (its hard links are refused)
  const covered = denied && deniedOrUnknown(denied, path.join(base, ...parts))
  if (covered) return {ok: false, reason: covered}
  const opened = DESCRIPTOR_PATHS ? openBeneath(base, parts) : openByCheckedPath(base, parts)
  if ('problem' in opened) return {ok: false, reason: opened.problem, detail: opened.detail}
  const {fd, before} = opened
  try {
    const stat = fs.fstatSync(fd)
    if (!stat.isFile()) return {ok: false, reason: `it is ${kindOf(stat)}`}
    if (stat.ino !== before.ino || stat.dev !== before.dev)
      return {ok: false, reason: 'it was replaced while the gateway opened it'}
    if (stat.nlink > 1)
      return {
        ok: false,
        reason: `it has ${stat.nlink - 1} other hard link(s) and may be a file from outside the workspace`,
      }
    if (stat.size > maxBytes)
      return {ok: false, reason: `it is ${stat.size} bytes, over the limit of ${maxBytes}`, overLimit: true}
    // one byte more than the limit allows tells a file that grew past it while being read
    let buffer = Buffer.allocUnsafe(Math.min(stat.size, maxBytes) + 1)
    let length = 0
    for (;;) {
      if (length === buffer.length) {
        if (length > maxBytes)
          return {ok: false, reason: `it grew past the limit of ${maxBytes} bytes while being read`, overLimit: true}
        // it grew, still within the limit: only then is anything copied
        buffer = Buffer.concat([buffer, Buffer.allocUnsafe(Math.min(length * 2, maxBytes + 1) - length)])
      }
      const read = fs.readSync(fd, buffer, length, buffer.length - length, null)
      if (read === 0) break
      length += read
    }
    return {ok: true, data: buffer.subarray(0, length)}
  } catch (error) {
    return {ok: false, reason: `it cannot be read (${errorCode(error)})`, detail: (error as Error).message}
  } finally {
    fs.closeSync(fd)
  }
}

function deniedOrUnknown(denied: (file: string) => boolean, file: string): string | undefined {
  try {
    return denied(file) ? "the agent's file_access.deny covers it" : undefined
  } catch (error) {
    return `the agent's file_access.deny cannot be checked (${errorCode(error)})`
  }
}

/** Makes the directory `relative` (and its parents) without following anything below the root. */
export function makeWorkspaceDirectory(root: string, relative: string): void {
  const parts = partsOf(relative)
  const base = realRoot(root)
  checkDirectories(base, [...parts, '.'], relative, true)
}

/** The longest link target taken (Linux's PATH_MAX less its NUL). */
const MAX_LINK_TARGET = 4095

/**
 * Puts a symbolic link to `target` at `relative` (the agent's own, as a run on another engine left
 * it): never followed, only made. It is made beside its name and renamed over it, in the folder as
 * checked and held open (through /proc/self/fd where there is one): a parent swapped for a link
 * meanwhile cannot move where it is made. A folder at that name is refused.
 */
export function makeWorkspaceSymlink(root: string, relative: string, target: string): void {
  if (target === '' || target.includes('\0') || Buffer.byteLength(target) > MAX_LINK_TARGET)
    throw refuse(relative, 'would be a link to an empty, too long or NUL-holding target')
  const parts = partsOf(relative)
  const base = realRoot(root)
  const dir = checkDirectories(base, parts, relative, true) as string
  if (lstatOrUndefined(path.join(base, ...parts))?.isDirectory()) throw refuse(relative, 'is a directory')
  const dirFd = fs.openSync(dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW)
  try {
    assertOpenedAt(dirFd, dir, relative)
    const here = openedPath(dirFd) === undefined ? dir : `/proc/self/fd/${dirFd}`
    const temp = path.join(here, temporaryName())
    const file = path.join(here, parts.at(-1)!)
    fs.symlinkSync(target, temp)
    try {
      fs.renameSync(temp, file)
    } catch (error) {
      fs.rmSync(temp, {force: true})
      throw error
    }
    giveToWorkspaceOwner(base, file)
  } finally {
    fs.closeSync(dirFd)
  }
}

/**
 * Removes the folder `relative` if it is empty, without following a link anywhere below the root;
 * false when it still holds something (it stays as it is).
 */
export function removeEmptyWorkspaceDirectory(root: string, relative: string): boolean {
  const parts = partsOf(relative)
  const base = realRoot(root)
  if (checkDirectories(base, parts, relative, false) === undefined) return true
  try {
    fs.rmdirSync(path.join(base, ...parts))
    return true
  } catch (error) {
    const code = (error as NodeJS.ErrnoException).code
    if (code === 'ENOENT') return true
    if (code === 'ENOTEMPTY' || code === 'EEXIST') return false
    throw error
  }
}

/** Removes `relative` (a directory with what it holds) without following a link anywhere below the root. */
export function removeWorkspaceEntry(root: string, relative: string): void {
  const parts = partsOf(relative)
  const base = realRoot(root)
  if (checkDirectories(base, parts, relative, false) === undefined) return
  // rmSync unlinks a link it meets, never what it points to
  fs.rmSync(path.join(base, ...parts), {recursive: true, force: true})
}
