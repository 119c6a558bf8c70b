import type {AgentConfig, IsolationLevel} from '../config/types.js'

// Apart from index.ts on purpose: `agent list` and `config check` need the level, not the runners
// index.ts can load (execa, the SDKs, better-sqlite3).

/** --unrestricted wins (an operator's explicit choice for this process), then container mode, then file_access. */
export function isolationLevelFor(agent: AgentConfig, unrestricted = false): IsolationLevel {
  if (unrestricted) return 'unrestricted'
  if (agent.container_mode.enabled) return 'container'
  if (agent.file_access.unrestricted) return 'unrestricted'
  return 'host-sandbox'
}
