import fs from 'node:fs'
import os from 'node:os'
import path from 'node:path'
import {processAlive} from '../util/process-alive.js'
import {killRunCgroups, removeRunCgroups, thawUnseenFrozen} from '../../sandbox/run-cgroup.js'
import {removeTrees} from '../../sandbox/directory-tree.js'
import {sharedGatewayDb} from '../state/gateway-db.js'

/**
 * What a live run holds on the host, recorded in gateway.db while it runs so that the next
 * start-up (serve or send) can kill what a crashed owner left: its keeper, cgroups, container and
 * private TMPDIR. The keeper normally does this itself the moment its owner dies; the record
 * covers the keeper dying too (OOM killer, a kill of everything).
 */
export interface RunProcessRecord {
  runId: string
  keeperPid?: number
  cgroups: string[]
  container?: string
  /** A container on an engine of the `engines:` list: how to reach it (docker flags: paths, no secret). */
  engine?: RunEngineRecord
  tmpDir?: string
}

export interface RunEngineRecord {
  name: string
  args: string[]
  /** What the host remembers of the agent's volume there: unknown after a crash, so forgotten. */
  syncState?: string
}

interface Row {
  run_id: string
  owner_pid: number
  owner_start: string | null
  keeper_pid: number | null
  keeper_start: string | null
  cgroups: string
  container: string | null
  engine: string | null
  tmp_dir: string | null
}

/** Field 22 of /proc/PID/stat (start time in clock ticks); undefined off Linux or when gone. */
export function processStartTime(pid: number): string | undefined {
  try {
    const stat = fs.readFileSync(`/proc/${pid}/stat`, 'utf8')
    return stat.slice(stat.lastIndexOf(')') + 2).split(' ')[19]
  } catch {
    return undefined
  }
}

/** Records (or updates) what a run holds; a failure is reported, never fatal to the run. */
export function recordRunProcess(home: string, record: RunProcessRecord, log?: (line: string) => void): void {
  try {
    sharedGatewayDb(home)
      .prepare(
        `INSERT INTO run_processes (run_id, owner_pid, owner_start, keeper_pid, keeper_start, cgroups, container, engine, tmp_dir, started_at)
         VALUES (@runId, @ownerPid, @ownerStart, @keeperPid, @keeperStart, @cgroups, @container, @engine, @tmpDir, @startedAt)
         ON CONFLICT (run_id) DO UPDATE SET keeper_pid = excluded.keeper_pid, keeper_start = excluded.keeper_start,
           cgroups = excluded.cgroups, container = excluded.container, engine = excluded.engine, tmp_dir = excluded.tmp_dir`,
      )
      .run({
        runId: record.runId,
        ownerPid: process.pid,
        ownerStart: processStartTime(process.pid) ?? null,
        keeperPid: record.keeperPid ?? null,
        keeperStart: (record.keeperPid && processStartTime(record.keeperPid)) ?? null,
        cgroups: JSON.stringify(record.cgroups),
        container: record.container ?? null,
        engine: record.engine ? JSON.stringify(record.engine) : null,
        tmpDir: record.tmpDir ?? null,
        startedAt: Date.now(),
      })
  } catch (error) {
    log?.(
      `could not record the run's processes in gateway.db (a crash now would leave them to the keeper alone): ${(error as Error).message}`,
    )
  }
}

export function forgetRunProcess(home: string, runId: string): void {
  try {
    sharedGatewayDb(home).prepare('DELETE FROM run_processes WHERE run_id = ?').run(runId)
  } catch {
    // the record only matters after a crash; a stale one is reaped harmlessly at the next start
  }
}

function ownerAlive(row: Row): boolean {
  if (row.owner_pid === process.pid) return processStartTime(process.pid) === row.owner_start
  if (!processAlive(row.owner_pid)) return false
  const start = processStartTime(row.owner_pid)
  return start === undefined || row.owner_start === null || start === row.owner_start
}

/** Whether the row's keeper still runs: the same process (start time), not a keeper that got its pid since. */
function isKeeper(row: Row): boolean {
  if (!row.keeper_pid) return false
  if (row.keeper_start !== null && processStartTime(row.keeper_pid) !== row.keeper_start) return false
  try {
    return fs.readFileSync(`/proc/${row.keeper_pid}/cmdline`, 'utf8').split('\0').includes('--keeper-fd')
  } catch {
    return false
  }
}

export interface ReapResult {
  /** Runs whose owner had died: their processes were killed. */
  runs: string[]
  /** Containers of those runs, for the caller to remove (needs the engine): on the local one unless `engine`. */
  containers: Array<{name: string; runId: string; engine?: RunEngineRecord}>
  /** Private TMPDIRs removed (of those runs, or left by owners that are gone). */
  tmpDirs: string[]
  /** What could not be removed, and why (the operator is told; the run records are forgotten all the same). */
  failures: string[]
}

/**
 * Start-up: kills every process of runs whose owner died (keeper, cgroups) and removes their
 * TMPDIRs and records; also removes /tmp/meepa-run-* directories whose owner is gone.
 */
export async function reapAbandonedRuns(home: string): Promise<ReapResult> {
  const result: ReapResult = {runs: [], containers: [], tmpDirs: [], failures: []}
  let rows: Row[]
  try {
    rows = sharedGatewayDb(home).prepare('SELECT * FROM run_processes').all() as Row[]
  } catch {
    rows = []
  }
  for (const row of rows) {
    if (ownerAlive(row)) continue
    // one run's leftovers that cannot all be removed (a directory the agent made read-only) must not stop the others
    try {
      if (isKeeper(row)) process.kill(row.keeper_pid!, 'SIGKILL')
    } catch {
      // gone meanwhile
    }
    let cgroupsLeft: string[] = []
    try {
      const cgroups = JSON.parse(row.cgroups) as string[]
      thawUnseenFrozen(cgroups)
      killRunCgroups(cgroups)
      cgroupsLeft = removeRunCgroups(cgroups)
    } catch (error) {
      result.failures.push(`the cgroups of ${row.run_id}: ${(error as Error).message}`)
    }
    // processes this start-up cannot see or kill (another pid namespace, frozen by a keeper that died
    // mid-kill) stay where they are, frozen or not, and so does the record, for a start-up that can
    for (const dir of cgroupsLeft)
      result.failures.push(`${dir}: processes of run ${row.run_id} are still in it, and this process cannot kill them`)
    if (cgroupsLeft.length > 0) continue
    if (row.container)
      result.containers.push({
        name: row.container,
        runId: row.run_id,
        ...(row.engine ? {engine: JSON.parse(row.engine) as RunEngineRecord} : {}),
      })
    if (row.tmp_dir && fs.existsSync(row.tmp_dir)) {
      try {
        await removeTrees([row.tmp_dir])
        result.tmpDirs.push(row.tmp_dir)
      } catch (error) {
        result.failures.push(`${row.tmp_dir}: ${(error as Error).message}`)
      }
    }
    // a container on a listed engine keeps its record until that engine has removed it (reclaim-runs.ts)
    if (!row.container || !row.engine) forgetRunProcess(home, row.run_id)
    result.runs.push(row.run_id)
  }
  await removeStaleTmpDirs(result)
  return result
}

/** `meepa-run-<owner pid>-...`: see withPrivateTmp. */
export const RUN_TMP_PREFIX = 'meepa-run-'
/** Directories of the older naming (no owner pid) are removed once this old. */
const UNOWNED_TMP_MAX_AGE_MS = 24 * 3600_000

async function removeStaleTmpDirs(result: ReapResult): Promise<void> {
  const root = os.tmpdir()
  let entries: string[]
  try {
    entries = fs.readdirSync(root).filter((name) => name.startsWith(RUN_TMP_PREFIX))
  } catch {
    return
  }
  const stale = entries.filter((name) => {
    const owner = /^meepa-run-(\d+)-/.exec(name)?.[1]
    try {
      const stat = fs.lstatSync(path.join(root, name))
      if (!stat.isDirectory() || stat.uid !== process.getuid?.()) return false
      return owner
        ? Number(owner) !== process.pid && !processAlive(Number(owner))
        : Date.now() - stat.mtimeMs > UNOWNED_TMP_MAX_AGE_MS
    } catch {
      return false // another start-up removed it first
    }
  })
  for (const name of stale) {
    const dir = path.join(root, name)
    try {
      await removeTrees([dir])
      result.tmpDirs.push(dir)
    } catch (error) {
      result.failures.push(`${dir}: ${(error as Error).message}`)
    }
  }
}
