import fs from 'node:fs'
import path from 'node:path'
import {AGENT_ID_PATTERN} from '../config/schema.js'
import {GatewayError} from '../util/errors.js'
import {agentsDir} from '../util/paths.js'

// Apart from workspace.ts on purpose: `agent list` and `config check` need where workspaces are,
// not how they are written (node:crypto).

const AGENT_ID = new RegExp(AGENT_ID_PATTERN)

export function validateAgentId(id: string): string {
  if (!AGENT_ID.test(id)) {
    throw new GatewayError(
      'E_USAGE',
      `invalid agent id "${id}": ids are 1-63 characters of a-z, 0-9 and "-", starting with a letter or digit`,
      {
        suggestions: ['for example: meepagateway agent create my-agent'],
      },
    )
  }
  return id
}

/** The id is validated first, so no id can name a path outside the agents folder. */
export function workspacePath(home: string, id: string): string {
  return path.join(agentsDir(home), validateAgentId(id))
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
