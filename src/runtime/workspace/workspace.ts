import fs from 'node:fs'
import path from 'node:path'
import {GatewayError} from '../util/errors.js'
import {agentsDir} from '../util/paths.js'
import {giveToWorkspaceOwner, workspaceEntry, writeWorkspaceFile} from './files.js'
import {workspacePath} from './location.js'
import {makeHomeDirectories} from '../util/make-directories.js'
import {sizeBytes} from '../config/size.js'
import {ensureWorkspaceVolume} from './volume.js'

const DEFAULT_SOUL = `# Soul

You are a helpful, concise assistant running inside meepagateway.
Your workspace is your home directory; keep files you create there.
`

const DEFAULT_MEMORY = `# Memory

Notes you want to keep across conversations. Edit this file with write_file.
`

/**
 * What ensureWorkspace makes and the gateway itself relies on: at other levels an agent that puts a
 * link there stops its own next runs (E_WORKSPACE, the operator told how to fix it); a run on a
 * remote engine never brings one back there.
 */
export const GATEWAY_ENTRIES: readonly string[] = ['SOUL.md', 'MEMORY.md', 'skills', 'memory.db']

export interface WorkspaceCreation {
  id: string
  path: string
  created: string[]
  kept: string[]
}

/** mkdir that another process may win (two messages to a new agent at once): false when it exists. */
function makeDirectory(dir: string, mode?: number): boolean {
  try {
    fs.mkdirSync(dir, {mode})
    return true
  } catch (error) {
    if ((error as NodeJS.ErrnoException).code === 'EEXIST') return false
    throw error
  }
}

/** Creates what is missing of a workspace; an operator's existing files are never touched. */
export function ensureWorkspace(home: string, id: string): WorkspaceCreation {
  const root = workspacePath(home, id)
  const created: string[] = []
  const kept: string[] = []
  makeHomeDirectories(agentsDir(home), home)
  if (makeDirectory(root, 0o700)) created.push('.')
  const files: Array<[string, string]> = [
    ['SOUL.md', DEFAULT_SOUL],
    ['MEMORY.md', DEFAULT_MEMORY],
  ]
  // the agent owns the workspace: nothing in it is followed or opened unless it is a regular file
  for (const [name, content] of files) {
    try {
      ;(writeWorkspaceFile(root, name, content, {exclusive: true}) ? created : kept).push(name)
    } catch (error) {
      throw error instanceof GatewayError ? error : wrapFsError(error, root)
    }
  }
  if (workspaceEntry(root, 'skills') === 'missing' && makeDirectory(path.join(root, 'skills'))) {
    giveToWorkspaceOwner(root, path.join(root, 'skills'))
    created.push('skills/')
  } else kept.push('skills/')
  if (workspaceEntry(root, 'memory.db') === 'missing') {
    // an empty file is an empty SQLite database; agent-run makes its tables (and moves a damaged one
    // aside). The gateway never opens it: SQLite opens by name and follows a link the agent could
    // swap in right after the create.
    ;(writeWorkspaceFile(root, 'memory.db', '', {exclusive: true, mode: 0o600}) ? created : kept).push('memory.db')
  } else kept.push('memory.db')
  return {id, path: root, created, kept}
}

/**
 * ensureWorkspace once the workspace is its own filesystem of `disk` (limits.disk) where the host
 * allows one (volume.ts): what every run, standby and write of the gateway goes through, so nothing
 * is written to a workspace whose volume is not mounted.
 */
export async function readyWorkspace(home: string, id: string, disk: string): Promise<WorkspaceCreation> {
  const existed = fs.existsSync(workspacePath(home, id))
  await ensureWorkspaceVolume(home, id, sizeBytes(disk, 'limits.disk'))
  const creation = ensureWorkspace(home, id)
  // the volume made the directory: it is still this call's creation
  if (!existed && !creation.created.includes('.')) creation.created.unshift('.')
  return creation
}

export interface WorkspaceSummary {
  id: string
  path: string
  exists: boolean
}

function wrapFsError(error: unknown, root: string): GatewayError {
  return new GatewayError('E_WORKSPACE', `cannot write the workspace ${root}: ${(error as Error).message}`, {
    cause: error,
    suggestions: ['check the permissions of MEEPAGATEWAY_HOME'],
  })
}
