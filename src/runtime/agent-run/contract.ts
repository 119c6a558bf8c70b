import type {AgentConfig, ProvidersConfig} from '../config/types.js'
import type {ErrorCode} from '../errors.js'

/** docs/agent-run.md: the one JSON object agent-run reads on stdin. */
export interface AgentRunInput {
  version: 1
  run_id: string
  agent: AgentConfig
  providers: ProvidersConfig
  /** Secret values by name; the only way secrets reach agent-run (never argv, never env). */
  secrets: Record<string, string>
  message: InboundMessage
  workspace: string
  /** Scrub every secret value from the reply, stored tool output and logs. */
  redact_secrets?: boolean
  /**
   * Secret names the runner deliberately set in agent-run's environment (container mode's
   * inject_secrets_env / inject_credentials_env): shell commands keep these, for tools like `gh`.
   */
  env_secrets?: string[]
}

export interface InboundMessage {
  id: string
  connector: string
  channel_id: string
  thread_id?: string
  user: {id: string; name: string}
  content: string
}

export interface ToolCallRecord {
  name: string
  ok: boolean
  ms: number
}

export interface Usage {
  input_tokens: number
  output_tokens: number
}

export interface AgentRunSuccess {
  version: 1
  ok: true
  run_id: string
  reply: {content: string}
  /** Why the loop ended: a final answer, or the max_iterations cut-off. */
  stop_reason: 'final' | 'max_iterations'
  iterations: number
  tool_calls: ToolCallRecord[]
  usage: Usage
  ms: number
}

export interface AgentRunFailure {
  version: 1
  ok: false
  run_id: string
  error: {code: ErrorCode; message: string; retryable: boolean; details?: Record<string, unknown>}
}

export type AgentRunOutput = AgentRunSuccess | AgentRunFailure
