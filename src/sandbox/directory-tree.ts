import fs from 'node:fs/promises'
import path from 'node:path'
import {startSubprocess, type SubprocessResult} from '../runtime/util/subprocess.js'
import {isEmptyDirectory} from '../runtime/util/empty-directory.js'
import {keeperHelper} from './keeper.js'

/**
 * A run's directory trees (its workspace, its TMPDIR), measured and removed at any depth. A run
 * can nest directories past PATH_MAX, where every call taking a full path fails (ENAMETOOLONG);
 * Node has no openat, so the helper (native/meepa-sandbox.c, `--measure` and `--remove`) walks
 * them from directory descriptors, never following a symlink, in a process of its own: the
 * gateway's event loop never waits on a run's files. Without the helper (macOS) Node walks full
 * paths, and what it cannot reach is an error, never skipped.
 */

/** What an entry costs at least: an empty file or symlink still takes an inode, and inodes run out too. */
const MIN_ENTRY_BYTES = 4096
/**
 * A measurement that takes longer is an error (so over the limit): the walk stops at the limit, so
 * this needs millions of entries.
 */
const MEASURE_TIMEOUT_MS = 120_000
/** A removal still running by then is given up and left to the next start-up's reaper. */
const REMOVE_TIMEOUT_MS = 10 * 60_000

export interface TreeUsage {
  /**
   * Bytes allocated below the roots (blocks, at least 4 KiB an entry, a hard-linked file once);
   * past `stopAbove` the walk stops, so this is a lower bound.
   */
  bytes: number
  /** Why some part could not be measured (then `bytes` is what was counted before): a limit counts it as exceeded. */
  error?: string
}

/**
 * Bytes allocated below `roots` (the roots themselves not counted; a root that is gone holds
 * nothing), walking no further once over `stopAbove`.
 */
export async function measureTrees(
  roots: string[],
  options: {stopAbove?: number; signal?: AbortSignal} = {},
): Promise<TreeUsage> {
  // a run's TMPDIR is most often empty (the host sandbox's is a tmpfs of its own): no process for it
  const walked = (await Promise.all(roots.map(async (root) => ((await holdsNothing(root)) ? [] : [root])))).flat()
  if (walked.length === 0) return {bytes: 0}
  const helper = keeperHelper()
  if (!helper) return measureByPaths(walked, options)
  const stop =
    options.stopAbove !== undefined ? ['--stop-above', String(Math.max(1, Math.floor(options.stopAbove)))] : []
  const result = await runHelper(helper, ['--measure', ...stop, ...walked], MEASURE_TIMEOUT_MS, options.signal)
  const bytes = Number(result.stdout.trim().split('\n').at(-1))
  if (!result.failed && Number.isSafeInteger(bytes)) return {bytes}
  return {bytes: Number.isSafeInteger(bytes) ? bytes : 0, error: helperReason(result.stderr, result.message)}
}

/**
 * A root that is gone or an empty directory: it holds nothing, and needs no walk. A symlink, or a
 * directory replaced while it was read, is left to the walk.
 */
async function holdsNothing(root: string): Promise<boolean> {
  try {
    const before = await fs.lstat(root)
    if (!before.isDirectory() || !isEmptyDirectory(root)) return false
    const after = await fs.lstat(root)
    return after.isDirectory() && after.ino === before.ino && after.dev === before.dev
  } catch (error) {
    return (error as NodeJS.ErrnoException).code === 'ENOENT'
  }
}

/** Removes each of `dirs` and everything below it (a dir already gone is fine); rejects naming what is left and why. */
export async function removeTrees(dirs: string[], signal?: AbortSignal): Promise<void> {
  if (dirs.length === 0) return
  const helper = keeperHelper()
  if (!helper) {
    for (const dir of dirs) await fs.rm(dir, {recursive: true, force: true})
    return
  }
  const result = await runHelper(helper, ['--remove', ...dirs], REMOVE_TIMEOUT_MS, signal)
  if (result.failed) throw new Error(helperReason(result.stderr, result.message))
}

/** What the helper prints: a number, or an error line. Only the end of a stream is kept. */
const HELPER_OUTPUT_KEPT = 4096

/**
 * Runs the helper and keeps the end of its output itself. A gateway runs it twice a message (the
 * measure before the input and at the end): execa's buffering (an async iterator per stream)
 * allocated ≈ 0.2 MB a call that outlived the child, which grew the gateway's heap (peak RSS,
 * BENCHMARKS.md).
 */
async function runHelper(
  helper: string,
  args: string[],
  timeoutMs: number,
  signal: AbortSignal | undefined,
): Promise<SubprocessResult> {
  const child = startSubprocess(helper, args, {
    env: {},
    timeoutMs,
    signal,
    killSignal: 'SIGKILL',
    buffer: {stdout: false, stderr: false},
  })
  const output = {stdout: '', stderr: ''}
  for (const name of ['stdout', 'stderr'] as const)
    child[name]?.setEncoding('utf8').on('data', (chunk: string) => {
      output[name] = (output[name] + chunk).slice(-HELPER_OUTPUT_KEPT)
    })
  return {...(await child), ...output}
}

/** The helper's own line (it names the entry and the errno), or how the process ended. */
function helperReason(stderr: string, ended: string): string {
  const line = stderr
    .trim()
    .split('\n')
    .at(-1)
    ?.replace(/^meepa-sandbox: /, '')
  return line || `the helper failed (${ended})`
}

/** Without the helper: full paths, so a tree deeper than PATH_MAX is an error here, as is anything else unreadable. */
async function measureByPaths(
  roots: string[],
  options: {stopAbove?: number; signal?: AbortSignal},
): Promise<TreeUsage> {
  let bytes = 0
  const seen = new Set<string>()
  const over = () => options.stopAbove !== undefined && bytes > options.stopAbove
  const walk = async (dir: string, root = false): Promise<void> => {
    let names: string[]
    try {
      names = await fs.readdir(dir)
    } catch (error) {
      // a root that is gone holds nothing (a run's TMPDIR removed from outside)
      if (root && (error as NodeJS.ErrnoException).code === 'ENOENT') return
      throw error
    }
    for (const name of names) {
      if (options.signal?.aborted) throw new Error('the measurement was cancelled')
      if (over()) return
      const file = path.join(dir, name)
      let stat
      try {
        stat = await fs.lstat(file)
      } catch (error) {
        if ((error as NodeJS.ErrnoException).code === 'ENOENT') continue
        throw error
      }
      if (stat.nlink > 1 && !stat.isDirectory()) {
        const key = `${stat.dev}:${stat.ino}`
        if (seen.has(key)) continue
        seen.add(key)
      }
      bytes += Math.max(stat.blocks * 512, MIN_ENTRY_BYTES)
      if (stat.isDirectory()) await walk(file)
    }
  }
  try {
    for (const root of roots) await walk(root, true)
    return {bytes}
  } catch (error) {
    // a path past PATH_MAX would fill the message: its start says enough
    return {bytes, error: (error as Error).message.slice(0, 300)}
  }
}
