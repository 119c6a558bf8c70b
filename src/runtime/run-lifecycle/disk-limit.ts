import fs from 'node:fs/promises'
import path from 'node:path'
import type {AgentRunOutput} from '../shapes/agent-run-contract.js'
import {failure} from '../agent-run/output.js'

/**
 * limits.disk: what a run may keep on disk (its workspace and private TMPDIR). Enforced two ways,
 * as no project quota is set up by the gateway: each file the run writes is capped at the limit
 * by RLIMIT_FSIZE (the keeper sets it; the kernel refuses the write past it, SIGXFSZ), and the
 * runner measures the total every few seconds and at the end, and ends the run with E_DISK once
 * it is over. A full disk therefore stays one agent's problem.
 */

/** What an entry costs at least: an empty file or symlink still takes an inode, and inodes run out too. */
const MIN_ENTRY_BYTES = 4096

/**
 * Bytes the files under `roots` occupy on disk (allocated blocks, at least one block each; symlinks
 * not followed, hard links once).
 */
export async function diskUsage(roots: string[], signal?: AbortSignal): Promise<number> {
  let total = 0
  const seen = new Set<string>()
  const walk = async (dir: string): Promise<void> => {
    let entries: string[]
    try {
      entries = await fs.readdir(dir)
    } catch {
      return
    }
    for (const name of entries) {
      if (signal?.aborted) return
      const file = path.join(dir, name)
      let stat
      try {
        stat = await fs.lstat(file, {bigint: false})
      } catch {
        continue
      }
      if (stat.nlink > 1 && !stat.isDirectory()) {
        const key = `${stat.dev}:${stat.ino}`
        if (seen.has(key)) continue
        seen.add(key)
      }
      total += Math.max(stat.blocks * 512, MIN_ENTRY_BYTES)
      if (stat.isDirectory()) await walk(file)
    }
  }
  for (const root of roots) await walk(root)
  return total
}

/**
 * Bytes held by files the processes `pids` keep open after unlinking them (or made with O_TMPFILE):
 * on no path, so diskUsage never sees them, yet they take disk until closed.
 */
export async function heldByDeletedFiles(pids: number[]): Promise<number> {
  let total = 0
  const seen = new Set<string>()
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
        if (!stat.isFile() || seen.has(key)) continue
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
  stop(): Promise<{usage: number; over: boolean}>
}

/**
 * Measures `roots` (plus what `hidden` counts) until stopped and calls `onOver` (once) when they
 * exceed `limitBytes`.
 */
export function watchDiskUsage(roots: string[], limitBytes: number, onOver: (usage: number) => void, hidden?: () => Promise<number>): DiskWatch {
  const stopped = new AbortController()
  let reported = false
  let timer: NodeJS.Timeout | undefined
  let final: Promise<{usage: number; over: boolean}> | undefined
  const tick = async () => {
    const started = Date.now()
    const usage = (await diskUsage(roots, stopped.signal)) + ((await hidden?.().catch(() => 0)) ?? 0)
    if (stopped.signal.aborted) return
    if (usage > limitBytes && !reported) {
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
      final ??= diskUsage(roots).then((usage) => ({usage, over: usage > limitBytes}))
      return final
    },
  }
}

export function mebibytes(bytes: number): string {
  return `${(bytes / 1024 / 1024).toFixed(1)} MiB`
}

/** The E_DISK failure of a run whose workspace is (or went) over limits.disk. */
export function diskFull(runId: string, limit: string, usage: number, workspace: string, when: 'before' | 'during'): AgentRunOutput {
  const message =
    when === 'before'
      ? `the agent's workspace already uses ${mebibytes(usage)}, more than its limits.disk (${limit}): the agent was not run`
      : `the run went over the agent's limits.disk (${limit}): its workspace and temporary files use ${mebibytes(usage)}, so it was stopped`
  return failure(runId, 'E_DISK', message, false, {
    disk_usage_bytes: usage,
    suggestions: [`remove files from ${workspace}`, 'or raise limits.disk for this agent'],
  })
}
