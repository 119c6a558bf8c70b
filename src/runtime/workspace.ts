import fs from 'node:fs'
import path from 'node:path'
import {AGENT_ID_PATTERN} from './config/schema.js'
import {GatewayError} from './errors.js'
import {openMemory} from './memory.js'
import {agentsDir} from './paths.js'

const AGENT_ID = new RegExp(AGENT_ID_PATTERN)

const DEFAULT_SOUL = `# Soul

You are a helpful, concise assistant running inside meepagateway.
Your workspace is your home directory; keep files you create there.
`

const DEFAULT_MEMORY = `# Memory

Notes you want to keep across conversations. Edit this file with write_file.
`

export function validateAgentId(id: string): string {
  if (!AGENT_ID.test(id)) {
    throw new GatewayError('E_USAGE', `invalid agent id "${id}": ids are 1-63 characters of a-z, 0-9 and "-", starting with a letter or digit`, {
      suggestions: ['for example: meepagateway agent create my-agent'],
    })
  }
  return id
}

/** The id is validated first, so no id can name a path outside the agents folder. */
export function workspacePath(home: string, id: string): string {
  return path.join(agentsDir(home), validateAgentId(id))
}

export interface WorkspaceCreation {
  id: string
  path: string
  created: string[]
  kept: string[]
  /** What was repaired on the way (a damaged memory.db moved aside), for the operator's log. */
  notices: string[]
}

/** Creates what is missing of a workspace; an operator's existing files are never touched. */
export function ensureWorkspace(home: string, id: string): WorkspaceCreation {
  const root = workspacePath(home, id)
  const created: string[] = []
  const kept: string[] = []
  fs.mkdirSync(agentsDir(home), {recursive: true, mode: 0o700})
  if (!fs.existsSync(root)) {
    fs.mkdirSync(root, {mode: 0o700})
    created.push('.')
  }
  const files: Array<[string, string]> = [
    ['SOUL.md', DEFAULT_SOUL],
    ['MEMORY.md', DEFAULT_MEMORY],
  ]
  for (const [name, content] of files) {
    try {
      fs.writeFileSync(path.join(root, name), content, {flag: 'wx'})
      created.push(name)
    } catch (error) {
      if ((error as NodeJS.ErrnoException).code !== 'EEXIST') throw wrapFsError(error, root)
      kept.push(name)
    }
  }
  const skills = path.join(root, 'skills')
  if (fs.existsSync(skills)) kept.push('skills/')
  else {
    fs.mkdirSync(skills)
    created.push('skills/')
  }
  const dbExisted = fs.existsSync(path.join(root, 'memory.db'))
  const notices: string[] = []
  openMemory(root, {onRecovered: (notice) => notices.push(notice)}).close() // creates the schema; existing rows are untouched
  ;(dbExisted ? kept : created).push('memory.db')
  return {id, path: root, created, kept, notices}
}

export interface WorkspaceSummary {
  id: string
  path: string
  exists: boolean
}

export function listWorkspaceIds(home: string): string[] {
  const dir = agentsDir(home)
  if (!fs.existsSync(dir)) return []
  return fs
    .readdirSync(dir, {withFileTypes: true})
    .filter((entry) => entry.isDirectory() && AGENT_ID.test(entry.name))
    .map((entry) => entry.name)
    .sort()
}

function wrapFsError(error: unknown, root: string): GatewayError {
  return new GatewayError('E_WORKSPACE', `cannot write the workspace ${root}: ${(error as Error).message}`, {
    cause: error,
    suggestions: ['check the permissions of MEEPAGATEWAY_HOME'],
  })
}
