import fs from 'node:fs'
import type {IsolationLevel, LoadedConfig} from '../config/types.js'
import {isolationLevelFor} from '../shapes/isolation-level.js'
import {workspacePath} from './location.js'

export interface AgentSummary {
  id: string
  name: string
  isolation: IsolationLevel
  provider: string
  connectors: string[]
  workspace: string
  workspace_exists: boolean
}

export function listAgents(loaded: LoadedConfig, unrestricted = false): AgentSummary[] {
  return loaded.config.agents.map((agent) => {
    const workspace = workspacePath(loaded.home, agent.id)
    return {
      id: agent.id,
      name: agent.name,
      isolation: isolationLevelFor(agent, unrestricted),
      provider: agent.provider ?? loaded.config.providers.primary,
      connectors: agent.connectors.map((connector) => connector.type),
      workspace,
      workspace_exists: fs.existsSync(workspace),
    }
  })
}
