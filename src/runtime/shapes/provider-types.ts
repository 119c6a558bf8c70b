import type {ProviderConfig} from '../config/types.js'
import type {Usage} from './agent-run-contract.js'
import type {ImageInput} from './image-input.js'

/** Provider-neutral conversation, converted to each wire format by its provider. */
export type ChatMessage =
  | {role: 'user'; content: string; images?: ImageInput[]}
  | {role: 'assistant'; content: string; tool_calls?: ToolCall[]}
  | {role: 'tool'; tool_call_id: string; name: string; content: string; is_error?: boolean}

export interface ToolCall {
  id: string
  name: string
  arguments: Record<string, unknown>
  /** The raw arguments text when the model's arguments were not a JSON object (`arguments` is then {}). */
  invalid_arguments?: string
}

export interface ToolDefinition {
  name: string
  description: string
  /** JSON Schema of the arguments object. */
  parameters: Record<string, unknown>
}

export interface ChatRequest {
  system: string
  messages: ChatMessage[]
  tools: ToolDefinition[]
  signal?: AbortSignal
}

export interface ChatResponse {
  content: string
  tool_calls: ToolCall[]
  usage: Usage
  /** Name of the provider (config key) that answered. */
  provider: string
  model: string
  /** The provider's own reason for stopping (end_turn, tool_use, stop, length, max_tokens...). */
  stop_reason?: string
}

export interface ChatProvider {
  readonly name: string
  readonly config: ProviderConfig
  chat(request: ChatRequest): Promise<ChatResponse>
  /** Opens the connection its first request will use (http-fetch.ts, preconnect). */
  preconnect?(): void
}
