import fs from 'node:fs'
import os from 'node:os'
import path from 'node:path'
import {Writable} from 'node:stream'
import {GatewayError} from '../util/errors.js'
import {TAR_END_BLOCKS, tarHeader, tarPadding} from '../util/tar.js'
import {readRegularFile} from '../util/regular-file.js'

/**
 * agent-run's side of the engine-side workspace sync (docs/architecture.md, "Workspaces on other
 * engines"): on a sync engine the agent's workspace is a volume there, and what a run changed in
 * it goes back to the host after the run's last frame. agent-run does both ends itself, already
 * loaded, instead of a shell and five programs around it:
 * - before its input, the go line: the run's start is marked in the volume (what was stamped
 *   later is the run's), and the time is kept in memory, where no command of the agent reaches it;
 * - after its result frame: every other process in the container is killed, then the names in the
 *   volume and a tar of what changed since the start are written on stdout (the trailer).
 * Everything it sends is handled by the host as hostile and bounded, so nothing here is trusted.
 */

/** Set by the container runner (to 1) on a sync engine's run containers; never elsewhere. */
export const WORKSPACE_SYNC_ENV = 'MEEPA_WORKSPACE_SYNC'
/** The sync's own folder in the volume (the start mark), never synced itself. */
export const SYNC_DIR = '.meepa-sync'
/**
 * The file in it with the token of the push that filled the volume, which the host keeps in its
 * record and sends on the go line: a volume without it is not the one the host knows.
 */
export const SYNC_FILL = 'filled'
/** A fill token: 16 random bytes in hex. */
export const FILL_TOKEN = /^[0-9a-f]{32}$/
/** The line that starts the trailer: `SYNC_TRAILER <list bytes>`, the NUL-separated names, the tar. */
export const SYNC_TRAILER = 'MEEPA-SYNC-TRAILER'

/**
 * The line the runner sends once it has taken a whole trailer back: agent-run, which waits for it
 * (or for stdin's end) before it exits, ends then. The container's teardown on the engine (its
 * processes, cgroup, mounts, the engine's own records) would otherwise run while the host writes
 * the changes; on an engine that shares the host's disk and CPUs it doubled what that takes.
 */
export const SYNC_TAKEN = 'MEEPA-SYNC-TAKEN'
/** The longest agent-run waits for SYNC_TAKEN after a whole trailer: a host that never says it must not keep the container. */
export const SYNC_TAKEN_WAIT_MS = 5_000

/**
 * How a sync engine's container says its volume is not the one the host filled: engine-disk.ts's
 * filesystem check, or a volume without the fill's token (LostVolume). It ends with this status
 * and mark before anything of the run started; the runner then copies the workspace whole and
 * places the run again.
 */
export const LOST_VOLUME_EXIT = 96
export const LOST_VOLUME_MARK = 'meepa: the workspace volume is not this agent'

/**
 * The volume's sync folder holds no token, or another than the host's last fill made there: the
 * engine lost the volume the host filled (a prune, a reset) and made an empty one, or another
 * gateway filled one of the same name. Run there, the take-back would remove on the host
 * everything the host knows the volume held.
 */
export class LostVolume extends Error {
  constructor() {
    super(
      `${LOST_VOLUME_MARK} (no ${SYNC_DIR}/${SYNC_FILL} with the token of the last fill by the host: the engine lost or replaced the volume, or a run removed it)`,
    )
    this.name = 'LostVolume'
  }
}

/** agent-run's log line with the run's start (`<line> <since>`), read by the host for its own listing. */
export const SYNC_START_LOG = "workspace sync: the run's changes are those stamped after"

/** The go line's run id as one shell word (the mark holds it; a helper compares it). */
export function syncToken(runId: string): string {
  return runId.replace(/[^A-Za-z0-9_-]/g, '_')
}

/**
 * The line the runner sends before the input, once the volume holds the host's state:
 * `pushed`: this message's push just wrote to the volume, so only what is stamped after the
 * volume's clock ticked past the mark is the run's; `clean`: the mark's own tick counts too;
 * `kept`: as `clean`, and the names the standby took while it waited are the start's. Then the run id, and the most the trailer may carry (limits.disk: past it, agent-run stops sending).
 */
export function syncGoLine(
  runId: string,
  pushed: boolean,
  maxBytes: number,
  fill: string,
  /** `kept`, a `clean` go line whose standby's names are the start's: nothing ran on the volume since it took them. */
  namesKept = false,
): string {
  const mode = pushed ? 'pushed' : namesKept ? 'kept' : 'clean'
  return `${mode} ${syncToken(runId)} ${Math.floor(maxBytes)} ${fill}\n`
}

/**
 * Whether this agent-run is a sync engine's: asked by the runner and a child of the container's
 * init (PID 1), the one process a kill of every other process leaves. Anywhere else (by hand, or
 * under a shell of its own), it never kills: the host then lists the changes itself.
 */
export function workspaceSyncHere(env: NodeJS.ProcessEnv = process.env): boolean {
  return env[WORKSPACE_SYNC_ENV] === '1' && process.ppid === 1
}

const GO_LINE = /^(pushed|clean|kept) ([A-Za-z0-9_-]{1,200}) (\d{1,16}) ([0-9a-f]{32})$/

/** What agent-run keeps of the run's start, in its own memory. */
export interface RunStart {
  /** A change stamped (ctime) after this is the run's: nanoseconds, the volume's own clock. */
  since: bigint
  /** The most the trailer may carry. */
  maxBytes: number
  /**
   * Each name in the volume at the start and its inode: a name new or replaced since is the run's.
   * Undefined until taken (no command of the agent can have run before): then ctime alone decides.
   */
  before?: Map<string, bigint>
}

/**
 * The sync's own folder, empty: whatever a run left there (a link, a FIFO, a stash) is removed.
 * No command of the agent runs yet; the fill's token stays. Without that token the volume is not
 * the one the host filled; an agent that removed it only costs its next message a whole copy.
 */
function cleanSyncFolder(workspace: string, fill: string): string {
  const dir = path.join(workspace, SYNC_DIR)
  if (!fs.lstatSync(dir, {throwIfNoEntry: false})?.isDirectory()) throw new LostVolume()
  // the agent owns the token's file: a regular file's first bytes, never through a link or a FIFO's wait
  if (readRegularFile(path.join(dir, SYNC_FILL), 64)?.toString('latin1').trim() !== fill) throw new LostVolume()
  for (const entry of fs.readdirSync(dir)) {
    if (entry === SYNC_FILL) continue
    const file = path.join(dir, entry)
    // the mark and tick made anew (a hard link at their name would be written through): unlinked
    if ((entry === 'mark' || entry === 'tick') && fs.lstatSync(file).isFile()) fs.unlinkSync(file)
    else fs.rmSync(file, {force: true, recursive: true})
  }
  return dir
}

/** Writes a small file of its own: a new one, or the one it made itself before (the tick). */
function writeNew(file: string, content: string, again = false): void {
  const fd = fs.openSync(
    file,
    fs.constants.O_WRONLY |
      fs.constants.O_CREAT |
      fs.constants.O_NOFOLLOW |
      (again ? fs.constants.O_TRUNC : fs.constants.O_EXCL),
    0o600,
  )
  try {
    fs.writeSync(fd, content)
  } finally {
    fs.closeSync(fd)
  }
}

const mtimeOf = (file: string) => fs.statSync(file, {bigint: true}).mtimeNs
const pause = (ms: number) => Atomics.wait(new Int32Array(new SharedArrayBuffer(4)), 0, 0, ms)

/**
 * The names of a folder as they are on disk. A name that is not UTF-8 would not come back from a
 * string (two names could even read the same): the walk refuses it, and the host lists the
 * changes itself, from bytes.
 */
function namesIn(dir: string): string[] {
  const names = fs.readdirSync(dir)
  if (names.some((name) => name.includes('\uFFFD')))
    for (const raw of fs.readdirSync(dir, {encoding: 'buffer'}))
      if (!Buffer.from(raw.toString('utf8')).equals(raw))
        throw new Error(`a name in ${dir} is not UTF-8 (${JSON.stringify(raw.toString('latin1'))})`)
  return names
}

/** A link's target as it is on disk; one that is not UTF-8 ends the walk, as such a name does (namesIn). */
function linkTarget(file: string): string {
  const raw = fs.readlinkSync(file, {encoding: 'buffer'})
  const target = raw.toString('utf8')
  if (!Buffer.from(target).equals(raw)) throw new Error(`the target of the link ${file} is not UTF-8`)
  return target
}

/**
 * Visits every entry below the workspace (but the sync's folder), parents before children, with
 * what `onEntry` returned for its parent (`root` for the top). `tolerant`: an entry it cannot read
 * is left out; else the walk fails on it.
 */
function eachEntry<T>(
  workspace: string,
  root: T,
  onEntry: (name: string, stat: fs.BigIntStats, parent: T) => T,
  tolerant: boolean,
): void {
  const visit = (dir: string, prefix: string, parent: T) => {
    let names: string[]
    try {
      names = namesIn(dir)
    } catch (error) {
      if (tolerant) return
      throw error
    }
    for (const entry of names) {
      if (!prefix && entry === SYNC_DIR) continue
      const name = prefix ? `${prefix}/${entry}` : entry
      const full = path.join(dir, entry)
      let stat: fs.BigIntStats | undefined
      try {
        stat = fs.lstatSync(full, {bigint: true, throwIfNoEntry: !tolerant})
      } catch (error) {
        if (tolerant) continue // a folder it may list but not enter, a path too long
        throw error
      }
      if (!stat) continue
      const mine = onEntry(name, stat, parent)
      if (stat.isDirectory()) visit(full, name, mine)
    }
  }
  visit(workspace, '', root)
}

/** Every name below the workspace (but the sync's folder) and its inode; what it cannot read, the end's walk fails on. */
function inodes(workspace: string): Map<string, bigint> {
  const found = new Map<string, bigint>()
  eachEntry(workspace, undefined, (name, stat) => void found.set(name, stat.ino), true)
  return found
}

/** The names of a workspace and their inodes, taken by a standby before its go line (namesBeforeGo). */
export interface NamesBeforeGo {
  workspace: string
  inodes: Map<string, bigint>
}

/**
 * The names of the standby's working directory (its container's workspace) while it waits for
 * its go line: a walk of the volume costs 2–10 ms, which the first LLM request's answer otherwise
 * waits for. The host says `kept` only when nothing ran on or wrote the volume since the standby
 * started (its generation, SyncedVolume); else markRunStart walks again. Undefined when it cannot
 * be walked.
 */
export function namesBeforeGo(workspace = process.cwd()): NamesBeforeGo | undefined {
  try {
    return {workspace: path.resolve(workspace), inodes: inodes(workspace)}
  } catch {
    return undefined
  }
}

/**
 * Marks the run's start in the volume from the go line, before any command of the agent runs;
 * what it returns stays in agent-run's memory. The mark (the run id) is for a helper that lists
 * the changes again when no whole trailer came. `taken`: the names as they were before the go
 * line, used when it says `kept` (nothing was written since) and they are of this workspace.
 */
export function markRunStart(workspace: string, goLine: string, taken?: NamesBeforeGo): RunStart {
  const go = GO_LINE.exec(goLine.trim())
  if (!go) throw new GatewayError('E_INPUT', 'the workspace sync go line is malformed')
  const [, mode, token, limit, fill] = go
  const maxBytes = Number(limit)
  try {
    const dir = cleanSyncFolder(workspace, fill!)
    const mark = path.join(dir, 'mark')
    writeNew(mark, `${token}\n`)
    const marked = mtimeOf(mark)
    // "newer than one nanosecond before the mark": with `clean`, the mark's own tick counts
    let since = marked - 1n
    if (mode === 'pushed') {
      // the push's own writes may share the mark's tick: wait for the volume's clock to pass it
      const tick = path.join(dir, 'tick')
      const until = Date.now() + 5_000
      for (let turn = 0; ; turn++) {
        writeNew(tick, '\n', turn > 0)
        if (mtimeOf(tick) > marked) break
        if (Date.now() > until) throw new Error("the volume's clock did not move past the mark in 5 s")
        pause(1)
      }
      since = marked
    }
    const start: RunStart = {since, maxBytes}
    // the host vouches that no run or push came between (a run moving a folder away and this one
    // moving it back would otherwise find its files' inodes unchanged, and never send them)
    if (mode === 'kept' && taken?.workspace === path.resolve(workspace)) start.before = taken.inodes
    // else the names as they are now, taken as soon as this turn of the event loop ends: while the
    // first LLM request is out, and before any tool can run (one needs an answer to that request)
    else setImmediate(() => (start.before = inodes(workspace)))
    return start
  } catch (error) {
    if (error instanceof LostVolume) throw error
    throw new GatewayError(
      'E_WORKSPACE',
      `could not mark the run's start in the workspace volume: ${(error as Error).message}`,
    )
  }
}

interface Walked {
  /** Every name in the volume (but the sync's folder), NUL-terminated, in walk order. */
  names: Buffer[]
  /** The files, folders and links changed since the start, parents before children. */
  changed: Array<{name: string; type: '0' | '5' | '2'; mode: number; mtimeMs: number; size: number; linkname?: string}>
}

/**
 * Changed (files, folders and symbolic links): stamped after the start (ctime), or a name that is new or names another inode than at
 * the start, and everything below such a folder: a folder moved in brings its files, whose own
 * times a rename does not touch.
 */
function walk(workspace: string, start: RunStart): Walked {
  const walked: Walked = {names: [], changed: []}
  eachEntry(
    workspace,
    false,
    (name, stat, movedIn) => {
      walked.names.push(Buffer.from(`./${name}\0`))
      const type = stat.isDirectory() ? '5' : stat.isFile() ? '0' : stat.isSymbolicLink() ? '2' : undefined
      const newHere = movedIn || (start.before !== undefined && start.before.get(name) !== stat.ino)
      if (type && (newHere || stat.ctimeNs > start.since))
        walked.changed.push({
          name: `./${name}`,
          type,
          mode: Number(stat.mode & 0o7777n),
          mtimeMs: Number(stat.mtimeMs),
          size: type === '0' ? Number(stat.size) : 0,
          ...(type === '2' ? {linkname: linkTarget(path.join(workspace, name))} : {}),
        })
      return newHere
    },
    false,
  )
  return walked
}

/** Writes `chunk`, waiting while the pipe is full (a large change never sits whole in memory). */
async function put(out: Writable, chunk: Buffer): Promise<void> {
  if (!out.write(chunk)) await new Promise<void>((resolve) => out.once('drain', resolve))
}

/** What the trailer gathers before a write: each write to the pipe wakes the engine's reader (≈ 1 ms on a slow host). */
const BATCH_BYTES = 256 * 1024

/** The trailer's pieces gathered into few writes: a small trailer goes in one. */
class Batch {
  private pieces: Buffer[] = []
  private size = 0

  constructor(private readonly out: Writable) {}

  async add(chunk: Buffer): Promise<void> {
    this.pieces.push(chunk)
    this.size += chunk.length
    if (this.size >= BATCH_BYTES) await this.flush()
  }

  async flush(): Promise<void> {
    if (this.size === 0) return
    const all = this.pieces.length === 1 ? this.pieces[0]! : Buffer.concat(this.pieces)
    this.pieces = []
    this.size = 0
    await put(this.out, all)
  }
}

/** A file's content, exactly the size its header announced: nothing else writes it now. */
async function putFile(batch: Batch, file: string, size: number): Promise<void> {
  const fd = fs.openSync(file, fs.constants.O_RDONLY | fs.constants.O_NOFOLLOW | fs.constants.O_NONBLOCK)
  try {
    if (!fs.fstatSync(fd).isFile()) throw new Error(`${file} is no longer a file`)
    let left = size
    while (left > 0) {
      const chunk = Buffer.allocUnsafe(Math.min(left, 1 << 20))
      const read = fs.readSync(fd, chunk, 0, chunk.length, null)
      if (read === 0) throw new Error(`${file} is shorter than it was`)
      await batch.add(chunk.subarray(0, read))
      left -= read
    }
  } finally {
    fs.closeSync(fd)
  }
}

/**
 * Kills every process of the container but PID 1 (its init) and this one: a shell tool's
 * background job would write on after the listing. Only where workspaceSyncHere() holds. A kill
 * is not a death: false when some still exist after `waitMs` (the host then lists the changes
 * itself, once the container is gone). The wait yields, so this process reaps its own children.
 */
export async function stopOtherProcesses(waitMs = 2_000): Promise<boolean> {
  const until = Date.now() + waitMs
  for (;;) {
    try {
      process.kill(-1, 'SIGKILL')
      process.kill(-1, 0) // throws ESRCH once none is left
    } catch {
      return true
    }
    if (Date.now() > until) return false
    await new Promise((resolve) => setTimeout(resolve, 1))
  }
}

/** What a trailer may carry past limits.disk (its names and headers): the host reads no more, agent-run sends no more. */
export const TRAILER_SLACK_BYTES = 1024 * 1024

/**
 * After the result frame, once nothing else runs (stopOtherProcesses): sends the trailer, a small
 * one in one write. Any error before the tar's end leaves it unfinished, which the host takes as
 * none: it lists the changes again itself.
 */
export async function sendWorkspaceChanges(workspace: string, start: RunStart, out: Writable): Promise<void> {
  const batch = new Batch(out)
  try {
    await sendTrailer(workspace, start, batch)
  } finally {
    await batch.flush()
  }
}

async function sendTrailer(workspace: string, start: RunStart, batch: Batch): Promise<void> {
  const {names, changed} = walk(workspace, start)
  const list = Buffer.concat(names)
  let sent = 0
  // hard links each come whole: a file linked a thousand times must not fill the pipe for hours
  const count = (bytes: number) => {
    sent += bytes
    if (sent > start.maxBytes + TRAILER_SLACK_BYTES) throw new Error('the changes are larger than limits.disk')
  }
  const send = (chunk: Buffer) => {
    count(chunk.length)
    return batch.add(chunk)
  }
  await send(Buffer.concat([Buffer.from(`${SYNC_TRAILER} ${list.length}\n`), list]))
  for (const entry of changed) {
    const {name, type, mode, mtimeMs, linkname} = entry
    await send(tarHeader({name, type, mode, mtimeMs, linkname}, entry.size))
    if (type !== '0' || entry.size === 0) continue
    count(entry.size)
    await putFile(batch, path.join(workspace, entry.name), entry.size)
    await send(tarPadding(entry.size))
  }
  await send(Buffer.alloc(TAR_END_BLOCKS))
}

/** How long agent-run waits for its go line before it warms up: a cold run's is there already. */
export const SYNC_WARM_UP_AFTER_MS = 25

/**
 * Runs the mark, the listing and the trailer once on a scratch tree of its own in TMPDIR (the
 * container's private tmpfs), while a standby waits for its go line. A fresh process's first mark
 * costs ≈ 1.3 ms and its first trailer ≈ 3 ms against ≈ 0.3 and 1 ms after (V8 compiling the code,
 * Node's first bigint stats), its first failed kill 0.5–1 ms against 0.03: time a standby's message
 * would otherwise spend between its input and its reply. The volume is never touched, and the
 * scratch is gone before the run's start is marked.
 */
export async function warmWorkspaceSync(tmp = os.tmpdir()): Promise<void> {
  const scratch = fs.mkdtempSync(path.join(tmp, 'meepa-sync-warm-'))
  try {
    const file = path.join(scratch, 'folder', 'file')
    fs.mkdirSync(path.dirname(file))
    fs.writeFileSync(file, 'before')
    fs.mkdirSync(path.join(scratch, SYNC_DIR))
    const fill = '0'.repeat(32)
    fs.writeFileSync(path.join(scratch, SYNC_DIR, SYNC_FILL), `${fill}\n`)
    const start = markRunStart(scratch, syncGoLine('warm', false, 1 << 20, fill))
    await new Promise((resolve) => setImmediate(resolve)) // the start's listing of names
    fs.writeFileSync(file, 'after')
    await sendWorkspaceChanges(scratch, start, new Writable({write: (_chunk, _encoding, done) => done()}))
    // stopOtherProcesses' way to its answer: signal 0 sends nothing, and where nothing else runs
    // (a waiting standby) it fails with ESRCH as at a run's end, whose first error costs 0.5–1 ms
    try {
      process.kill(-1, 0)
    } catch {
      // nothing else to signal: the answer it warms
    }
  } finally {
    fs.rmSync(scratch, {force: true, recursive: true})
  }
}
