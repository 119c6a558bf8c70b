import fs from 'node:fs'
import os from 'node:os'
import path from 'node:path'
import {removeTrees} from '../../sandbox/directory-tree.js'
import {RUN_TMP_PREFIX} from './run-processes.js'

/**
 * A per-run TMPDIR, removed when the run ends whatever happened. Its name carries this process's
 * pid, so a later start-up knows it is stale once this process is gone (reapAbandonedRuns).
 * A removal that fails is logged: the run's result stands.
 */
export async function withPrivateTmp<T>(
  runId: string,
  use: (dir: string) => Promise<T>,
  log?: (line: string) => void,
): Promise<T> {
  const dir = makePrivateTmp(runId)
  try {
    return await use(dir)
  } finally {
    await removePrivateTmp(dir, log)
  }
}

/** A private TMPDIR that outlives one call (a standby agent-run's, made before its run exists). */
export function makePrivateTmp(runId: string): string {
  return fs.mkdtempSync(path.join(os.tmpdir(), `${RUN_TMP_PREFIX}${process.pid}-${runId.slice(0, 12)}-`))
}

/** Removes a run's TMPDIR whatever its depth and size, off the event loop; never throws (a failure is logged). */
export async function removePrivateTmp(dir: string, log?: (line: string) => void): Promise<void> {
  try {
    // most are empty (behind bubblewrap the run wrote in a tmpfs of its own): one rmdir, no helper process
    fs.rmdirSync(dir)
    return
  } catch {
    // not empty, or not a plain directory: the helper removes it whatever it holds
  }
  try {
    await removeTrees([dir])
  } catch (error) {
    log?.(
      `could not remove the run's TMPDIR (the next start-up of serve or send removes it): ${(error as Error).message}`,
    )
  }
}

/** The environment every level gives agent-run: nothing from the operator's shell but PATH and locale. */
export function agentEnvironment(workspace: string, tmp: string): Record<string, string> {
  return {
    PATH: process.env.PATH ?? '/usr/local/bin:/usr/bin:/bin',
    HOME: workspace,
    TMPDIR: tmp,
    LANG: process.env.LANG ?? 'C.UTF-8',
    ...(process.env.MEEPA_RETRY_BASE_MS ? {MEEPA_RETRY_BASE_MS: process.env.MEEPA_RETRY_BASE_MS} : {}),
  }
}
