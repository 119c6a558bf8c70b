/** An engine runs may go to, as the dashboard shows it (runners/container/engines.ts makes it). */
export interface EngineView {
  name: string
  /** `up` answered its last ping; `unknown`: not asked yet. */
  health: 'up' | 'down' | 'unknown'
  problem?: string
  down_since?: string
  active_runs: number
  /** null: no limit (the local engine without an `engines:` list). */
  max_runs: number | null
  standbys: number
  version?: string
}
