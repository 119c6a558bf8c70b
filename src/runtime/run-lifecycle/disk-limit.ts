import fs from 'node:fs/promises'
import type {AgentRunOutput} from '../shapes/agent-run-contract.js'
import {failure} from '../agent-run/output.js'
import {measureTrees, type TreeUsage} from '../../sandbox/directory-tree.js'
import {volumeUsedBytes} from '../workspace/volume.js'

/**
 * limits.disk: what a run may keep on disk (its workspace and private TMPDIR). Under a root gateway
 * the workspace is a filesystem of exactly the limit (workspace/volume.ts), read here from its own
 * count; everything else is held two ways: each file the run writes is capped at the limit
 * by RLIMIT_FSIZE (the keeper sets it; the kernel refuses the write past it, SIGXFSZ), and the
 * runner measures the total every few seconds and at the end (at any depth, see
 * src/sandbox/directory-tree.ts), and ends the run with E_DISK once it is over or cannot be
 * measured. A full disk therefore stays one agent's problem.
 */

/** A workspace's (and TMPDIR's) measured usage. */
export type DiskUsage = TreeUsage

/**
 * What the files under `roots` occupy on disk, measured no further than past `limitBytes` (see
 * measureTrees); a root that is its workspace volume is read from its filesystem, not walked.
 */
export async function diskUsage(roots: string[], limitBytes: number, signal?: AbortSignal): Promise<DiskUsage> {
  let onVolumes = 0
  const walked: string[] = []
  for (const root of roots) {
    const used = await volumeUsedBytes(root).catch(() => undefined)
    if (used !== undefined) onVolumes += used
    else walked.push(root)
  }
  if (walked.length === 0) return {bytes: onVolumes}
  const measured = await measureTrees(walked, {stopAbove: limitBytes - onVolumes, signal})
  return {...measured, bytes: measured.bytes + onVolumes}
}

/** Over the limit: past it, or not measurable (an error is never taken for room). */
export function overLimit(usage: DiskUsage, limitBytes: number): boolean {
  return usage.error !== undefined || usage.bytes > limitBytes
}

/**
 * Bytes held by files the processes `pids` keep open after unlinking them (or made with O_TMPFILE):
 * on no path, so a walk never sees them, yet they take disk until closed. Those on a workspace
 * volume among `roots` are left out: its filesystem's own count (diskUsage) has them already.
 */
export async function heldByDeletedFiles(pids: number[], roots: string[] = []): Promise<number> {
  let total = 0
  const seen = new Set<string>()
  const counted = new Set<number>()
  for (const root of roots)
    if ((await volumeUsedBytes(root).catch(() => undefined)) !== undefined) counted.add((await fs.stat(root)).dev)
  for (const pid of pids) {
    let fds: string[]
    try {
      fds = await fs.readdir(`/proc/${pid}/fd`)
    } catch {
      continue
    }
    for (const fd of fds) {
      const link = `/proc/${pid}/fd/${fd}`
      try {
        if (!(await fs.readlink(link)).endsWith(' (deleted)')) continue
        const stat = await fs.stat(link)
        const key = `${stat.dev}:${stat.ino}`
        if (!stat.isFile() || seen.has(key) || counted.has(stat.dev)) continue
        seen.add(key)
        total += stat.blocks * 512
      } catch {
        // closed meanwhile
      }
    }
  }
  return total
}

/** The shortest pause between two measurements; longer when measuring takes long (big workspaces). */
const MIN_INTERVAL_MS = 1000
const INTERVAL_PER_MEASURE_MS = 10

export interface DiskWatch {
  /** Stops measuring; resolves with the usage measured now, and whether it is over the limit. */
  stop(): Promise<{usage: DiskUsage; over: boolean}>
}

/**
 * Measures `roots` (plus what `hidden` counts) until stopped and calls `onOver` (once) when they
 * exceed `limitBytes`.
 */
export function watchDiskUsage(
  roots: string[],
  limitBytes: number,
  onOver: (usage: DiskUsage) => void,
  hidden?: () => Promise<number>,
): DiskWatch {
  const stopped = new AbortController()
  let reported = false
  let timer: NodeJS.Timeout | undefined
  let final: Promise<{usage: DiskUsage; over: boolean}> | undefined
  const tick = async () => {
    const started = Date.now()
    const held = (await hidden?.().catch(() => 0)) ?? 0
    const measured = await diskUsage(roots, limitBytes - held, stopped.signal)
    if (stopped.signal.aborted) return
    const usage = {...measured, bytes: measured.bytes + held}
    if (overLimit(usage, limitBytes) && !reported) {
      reported = true
      onOver(usage)
      return
    }
    timer = setTimeout(() => void tick(), Math.max(MIN_INTERVAL_MS, (Date.now() - started) * INTERVAL_PER_MEASURE_MS))
  }
  timer = setTimeout(() => void tick(), MIN_INTERVAL_MS)
  return {
    stop() {
      stopped.abort()
      clearTimeout(timer)
      final ??= diskUsage(roots, limitBytes).then((usage) => ({usage, over: overLimit(usage, limitBytes)}))
      return final
    },
  }
}

export function mebibytes(bytes: number): string {
  return `${(bytes / 1024 / 1024).toFixed(1)} MiB`
}

/** The E_DISK failure of a run whose workspace is (or went) over limits.disk, or could not be measured. */
export function diskFull(
  runId: string,
  limit: string,
  usage: DiskUsage,
  workspace: string,
  when: 'before' | 'during',
): AgentRunOutput {
  const message = usage.error
    ? `the agent's files could not be measured against its limits.disk (${limit}), which counts as over it: ${usage.error}; ${when === 'before' ? 'the agent was not run' : 'the run was stopped'}`
    : when === 'before'
      ? `the agent's workspace already uses at least ${mebibytes(usage.bytes)}, more than its limits.disk (${limit}): the agent was not run`
      : `the run went over the agent's limits.disk (${limit}): its workspace and temporary files use at least ${mebibytes(usage.bytes)}, so it was stopped`
  return failure(runId, 'E_DISK', message, false, {
    disk_usage_bytes: usage.bytes,
    ...(usage.error ? {disk_unmeasured: usage.error} : {}),
    suggestions: [`remove files from ${workspace}`, 'or raise limits.disk for this agent'],
  })
}
