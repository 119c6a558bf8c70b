import type {AgentConfig, ProvidersConfig} from '../config/types.js'
import type {ErrorCode} from '../util/errors.js'

/** The first JSON value agent-run reads on stdin (docs/agent-run.md). */
export interface AgentRunInput {
  version: 1
  run_id: string
  /**
   * Set by every runner: agent-run asks its runner for each LLM call over stdin/stdout (this is the
   * channel protocol version). Absent when run by hand: agent-run then calls the providers itself,
   * with keys from its own environment.
   */
  llm_channel?: number
  agent: AgentConfig
  providers: ProvidersConfig
  /**
   * The agent's own secrets by name, for its tools and for redaction (never argv, never env). Provider
   * keys are not among them unless the operator set image_config.inject_credentials_env.
   */
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
  /**
   * Milliseconds from reading the input until agent-run ends itself (a container's own deadline,
   * which holds when neither its runner nor the Docker engine can stop it).
   */
  timeout_ms?: number
}

export interface InboundMessage {
  id: string
  connector: string
  channel_id: string
  thread_id?: string
  user: {id: string; name: string}
  /** May be empty when the message is only files. */
  content: string
  /** The files that came with the message, received or skipped (docs/architecture.md, "Files in"). */
  attachments?: MessageAttachment[]
}

/**
 * One file of a message as the agent sees it: received into the workspace at `path`
 * (`inbox/<message id>/<name>`, relative to the workspace), or not, with `skipped` saying why.
 */
export interface MessageAttachment {
  /** The sanitised name (the platform's, made safe for a file name). */
  name: string
  content_type: string
  /** Bytes received; for a skipped file the size the platform declared, when it did. */
  size: number
  path?: string
  skipped?: string
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
  /**
   * Files the agent asked to send with its reply (its send_file tool), by path relative to its
   * workspace, in the order asked. Only names: the gateway reads each file itself after the run.
   */
  files?: FileToSend[]
}

export interface FileToSend {
  path: string
}

/** At most this many files in one result; more is a broken protocol, not a request. */
export const MAX_FILES_IN_RESULT = 1000
/** A path in a result longer than this is a broken protocol (PATH_MAX). */
export const MAX_FILE_PATH_LENGTH = 4096

export interface AgentRunFailure {
  version: 1
  ok: false
  run_id: string
  error: {code: ErrorCode; message: string; retryable: boolean; details?: Record<string, unknown>}
}

export type AgentRunOutput = AgentRunSuccess | AgentRunFailure
