import fs from 'node:fs'
import path from 'node:path'
import {canonicalPath} from '../../sandbox/paths.js'
import type {SandboxPolicy} from '../../sandbox/policy.js'

/** SQLite's WAL companions of the agent's memory.db (src/runtime/workspace/memory.ts opens it in WAL mode). */
const SQLITE_COMPANIONS = ['memory.db-wal', 'memory.db-shm']

/**
 * A deny inside the workspace leaves the workspace root "listing only": nothing new can be created
 * in it, and SQLite could no longer create memory.db's -wal and -shm files next to it. Creating them
 * before the policy is compiled turns them into ordinary siblings that keep read-write rules.
 * Returns true when files were created, so the caller recompiles the policy to include them.
 */
export function prepareWorkspaceForPolicy(workspace: string, policy: SandboxPolicy): boolean {
  const root = canonicalPath(workspace)
  if (!policy.lowered.some((dir) => dir.path === root)) return false
  let created = false
  for (const name of SQLITE_COMPANIONS) {
    const file = path.join(root, name)
    try {
      fs.writeFileSync(file, '', {flag: 'wx', mode: 0o600})
      created = true
    } catch (error) {
      if ((error as NodeJS.ErrnoException).code !== 'EEXIST') throw error
    }
  }
  return created
}
