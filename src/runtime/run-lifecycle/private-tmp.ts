import fs from 'node:fs'
import os from 'node:os'
import path from 'node:path'
import {RUN_TMP_PREFIX} from './run-processes.js'

/**
 * A per-run TMPDIR, removed when the run ends whatever happened. Its name carries this process's
 * pid, so a later start-up knows it is stale once this process is gone (reapAbandonedRuns).
 */
export async function withPrivateTmp<T>(runId: string, use: (dir: string) => Promise<T>): Promise<T> {
  const dir = makePrivateTmp(runId)
  try {
    return await use(dir)
  } finally {
    removePrivateTmp(dir)
  }
}

/** A private TMPDIR that outlives one call (a standby agent-run's, made before its run exists). */
export function makePrivateTmp(runId: string): string {
  return fs.mkdtempSync(path.join(os.tmpdir(), `${RUN_TMP_PREFIX}${process.pid}-${runId.slice(0, 12)}-`))
}

export function removePrivateTmp(dir: string): void {
  fs.rmSync(dir, {recursive: true, force: true})
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
