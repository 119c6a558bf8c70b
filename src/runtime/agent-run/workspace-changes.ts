import fs from 'node:fs'
import path from 'node:path'
import type {Writable} from 'node:stream'
import {GatewayError} from '../util/errors.js'
import {TAR_END_BLOCKS, tarHeader, tarPadding} from '../util/tar.js'

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
/** The line that starts the trailer: `SYNC_TRAILER <list bytes>`, the NUL-separated names, the tar. */
export const SYNC_TRAILER = 'MEEPA-SYNC-TRAILER'

/** The go line's run id as one shell word (the mark holds it; a helper compares it). */
export function syncToken(runId: string): string {
  return runId.replace(/[^A-Za-z0-9_-]/g, '_')
}

/**
 * The line the runner sends before the input, once the volume holds the host's state:
 * `pushed`: this message's push just wrote to the volume, so only what is stamped after the
 * volume's clock ticked past the mark is the run's; `clean`: the mark's own tick counts too.
 */
export function syncGoLine(runId: string, pushed: boolean): string {
  return `${pushed ? 'pushed' : 'clean'} ${syncToken(runId)}\n`
}

/**
 * Whether this agent-run is a sync engine's: asked by the runner and a child of the container's
 * init (PID 1), the one process a kill of every other process leaves. Anywhere else (by hand, or
 * under a shell of its own), it never kills: the host then lists the changes itself.
 */
export function workspaceSyncHere(env: NodeJS.ProcessEnv = process.env): boolean {
  return env[WORKSPACE_SYNC_ENV] === '1' && process.ppid === 1
}

const GO_LINE = /^(pushed|clean) ([A-Za-z0-9_-]{1,200})$/

/** A folder of the sync's own in the volume: whatever the agent left at its name is removed first. */
function syncFolder(workspace: string): string {
  const dir = path.join(workspace, SYNC_DIR)
  const stat = fs.lstatSync(dir, {throwIfNoEntry: false})
  if (stat?.isDirectory()) return dir
  if (stat) fs.rmSync(dir, {force: true, recursive: true})
  fs.mkdirSync(dir, {mode: 0o700})
  return dir
}

/** Writes a small file without following a link or blocking on a FIFO planted at its name. */
function writePlain(file: string, content: string): void {
  const stat = fs.lstatSync(file, {throwIfNoEntry: false})
  if (stat && !stat.isFile()) fs.rmSync(file, {force: true, recursive: true})
  const fd = fs.openSync(
    file,
    fs.constants.O_WRONLY | fs.constants.O_CREAT | fs.constants.O_TRUNC | fs.constants.O_NOFOLLOW,
    0o600,
  )
  try {
    fs.writeSync(fd, content)
  } finally {
    fs.closeSync(fd)
  }
}

const mtimeOf = (file: string) => fs.statSync(file, {bigint: true}).mtimeNs

/**
 * Marks the run's start in the volume from the go line; returns the time after which a change is
 * the run's (nanoseconds, the volume's own clock and granularity: compared with ctime, which no
 * one in the container can set back).
 */
export function markRunStart(workspace: string, goLine: string): bigint {
  const go = GO_LINE.exec(goLine.trim())
  if (!go) throw new GatewayError('E_INPUT', 'the workspace sync go line is malformed')
  const [, mode, token] = go
  try {
    const dir = syncFolder(workspace)
    const mark = path.join(dir, 'mark')
    writePlain(mark, `${token}\n`)
    const marked = mtimeOf(mark)
    if (mode === 'clean') return marked - 1n // "newer than one nanosecond before": the mark's own tick counts
    // the push's own writes may share the mark's tick: wait for the volume's clock to pass it
    const tick = path.join(dir, 'tick')
    const until = Date.now() + 5_000
    do writePlain(tick, '\n')
    while (mtimeOf(tick) <= marked && Date.now() < until)
    return marked
  } catch (error) {
    throw new GatewayError(
      'E_WORKSPACE',
      `could not mark the run's start in the workspace volume: ${(error as Error).message}`,
    )
  }
}

interface Walked {
  /** Every name in the volume (but the sync's folder), NUL-terminated, in walk order. */
  names: Buffer[]
  /** The files and folders changed since the start, parents before children. */
  changed: Array<{name: string; folder: boolean; mode: number; mtimeMs: number; size: number}>
}

function walk(workspace: string, since: bigint): Walked {
  const walked: Walked = {names: [], changed: []}
  const visit = (dir: string, prefix: string) => {
    for (const entry of fs.readdirSync(dir)) {
      if (!prefix && entry === SYNC_DIR) continue
      const name = prefix ? `${prefix}/${entry}` : entry
      const full = path.join(dir, entry)
      const stat = fs.lstatSync(full, {bigint: true})
      walked.names.push(Buffer.from(`./${name}\0`))
      const folder = stat.isDirectory()
      if ((folder || stat.isFile()) && stat.ctimeNs > since)
        walked.changed.push({
          name: `./${name}`,
          folder,
          mode: Number(stat.mode & 0o7777n),
          mtimeMs: Number(stat.mtimeMs),
          size: folder ? 0 : Number(stat.size),
        })
      if (folder) visit(full, name)
    }
  }
  visit(workspace, '')
  return walked
}

/** Writes `chunk`, waiting while the pipe is full (a large change never sits whole in memory). */
async function put(out: Writable, chunk: Buffer): Promise<void> {
  if (!out.write(chunk)) await new Promise<void>((resolve) => out.once('drain', resolve))
}

/** A file's content, exactly the size its header announced: nothing else writes it now. */
async function putFile(out: Writable, file: string, size: number): Promise<void> {
  const fd = fs.openSync(file, fs.constants.O_RDONLY | fs.constants.O_NOFOLLOW | fs.constants.O_NONBLOCK)
  try {
    if (!fs.fstatSync(fd).isFile()) throw new Error(`${file} is no longer a file`)
    let left = size
    while (left > 0) {
      const chunk = Buffer.allocUnsafe(Math.min(left, 1 << 20))
      const read = fs.readSync(fd, chunk, 0, chunk.length, null)
      if (read === 0) throw new Error(`${file} is shorter than it was`)
      await put(out, chunk.subarray(0, read))
      left -= read
    }
  } finally {
    fs.closeSync(fd)
  }
}

/**
 * Kills every process of the container but PID 1 (its init) and this one: a shell tool's
 * background job would write on after the listing. Only where workspaceSyncHere() holds.
 */
export function stopOtherProcesses(): void {
  try {
    process.kill(-1, 'SIGKILL')
  } catch {
    // none left to signal
  }
}

/**
 * After the result frame, once nothing else runs (stopOtherProcesses): sends the trailer. Any
 * error before the tar's end leaves it unfinished, which the host takes as none: it lists the
 * changes again itself.
 */
export async function sendWorkspaceChanges(workspace: string, since: bigint, out: Writable): Promise<void> {
  const {names, changed} = walk(workspace, since)
  const list = Buffer.concat(names)
  await put(out, Buffer.concat([Buffer.from(`${SYNC_TRAILER} ${list.length}\n`), list]))
  for (const entry of changed) {
    const type = entry.folder ? '5' : '0'
    await put(out, tarHeader({name: entry.name, type, mode: entry.mode, mtimeMs: entry.mtimeMs}, entry.size))
    if (entry.folder || entry.size === 0) continue
    await putFile(out, path.join(workspace, entry.name), entry.size)
    await put(out, tarPadding(entry.size))
  }
  await put(out, Buffer.alloc(TAR_END_BLOCKS))
}
