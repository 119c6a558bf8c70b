import type {ErrorCode} from '../util/errors.js'
import type {ChatMessage, ChatRequest, ChatResponse, ToolDefinition} from '../shapes/provider-types.js'
import {MAX_FILE_PATH_LENGTH, MAX_FILES_IN_RESULT, type AgentRunOutput} from '../shapes/agent-run-contract.js'
import {imageInputProblem, MAX_IMAGES_PER_MESSAGE} from '../shapes/image-input.js'

/**
 * The LLM channel (docs/agent-run.md): agent-run's stdin/stdout with its runner, as JSON lines.
 * The runner holds the provider keys and makes every LLM call; agent-run only asks. It works the
 * same at every level because it is the pipe every level already has (docker run -i included).
 *
 *   runner → agent-run (stdin):  line 1: the input, with `llm_channel: 1`
 *                                then: {"type":"llm_response","id":N,"ok":true,"response":{...}}
 *                                  or: {"type":"llm_response","id":N,"ok":false,"error":{...}}
 *   agent-run → runner (stdout): {"type":"llm_request","id":N,"request":{system,messages,tools}}
 *                                last: {"type":"result","output":{...the contract's output}}
 */
export const LLM_CHANNEL_VERSION = 1

/** Longest frame either side accepts; a conversation is far smaller, anything bigger is a mistake or an attack. */
export const MAX_FRAME_BYTES = 8 * 1024 * 1024

export interface LlmRequestFrame {
  type: 'llm_request'
  id: number
  request: Omit<ChatRequest, 'signal'>
}

export interface ResultFrame {
  type: 'result'
  output: AgentRunOutput
}

export type AgentRunFrame = LlmRequestFrame | ResultFrame

export interface LlmError {
  code: ErrorCode
  message: string
  retryable: boolean
  suggestions?: string[]
  details?: Record<string, unknown>
}

export type LlmResponseFrame =
  | {type: 'llm_response'; id: number; ok: true; response: ChatResponse}
  | {type: 'llm_response'; id: number; ok: false; error: LlmError}

/** A frame that breaks the protocol; the side that reads it ends the run with this message. */
export class FrameError extends Error {}

/**
 * Splits a byte stream into lines, refusing any line longer than `maxBytes` (so a peer that never
 * sends a newline cannot make us buffer without bound).
 */
export class LineSplitter {
  private pending: Buffer[] = []
  private pendingBytes = 0

  constructor(
    private readonly maxBytes: number,
    private readonly onLine: (line: string) => void,
  ) {}

  push(chunk: Buffer): void {
    let start = 0
    for (let newline = chunk.indexOf(10, start); newline !== -1; newline = chunk.indexOf(10, start)) {
      this.append(chunk.subarray(start, newline))
      const line = Buffer.concat(this.pending).toString('utf8')
      this.pending = []
      this.pendingBytes = 0
      start = newline + 1
      if (line.trim()) this.onLine(line)
    }
    if (start < chunk.length) this.append(chunk.subarray(start))
  }

  /** What is left after the last newline (a final line without one). */
  rest(): string {
    return Buffer.concat(this.pending).toString('utf8')
  }

  private append(part: Buffer): void {
    this.pendingBytes += part.length
    if (this.pendingBytes > this.maxBytes) throw new FrameError(`a line longer than ${this.maxBytes} bytes`)
    this.pending.push(part)
  }
}

const isObject = (value: unknown): value is Record<string, unknown> =>
  typeof value === 'object' && value !== null && !Array.isArray(value)

function parseFrame(line: string): Record<string, unknown> {
  let value: unknown
  try {
    value = JSON.parse(line)
  } catch (error) {
    throw new FrameError(`a line that is not JSON (${(error as Error).message})`)
  }
  if (!isObject(value)) throw new FrameError('a line that is not a JSON object')
  return value
}

const frameId = (frame: Record<string, unknown>): number => {
  if (!Number.isSafeInteger(frame.id) || (frame.id as number) < 1)
    throw new FrameError(`a ${String(frame.type)} frame whose id is not a positive integer`)
  return frame.id as number
}

/** Host side: one line of agent-run's stdout, checked down to every field the providers will read. */
export function parseAgentRunFrame(line: string): AgentRunFrame {
  const frame = parseFrame(line)
  if (frame.type === 'result') {
    const output = frame.output
    const problem = outputProblem(output)
    if (problem) throw new FrameError(`a result frame without a valid output object (${problem})`)
    return {type: 'result', output: output as unknown as AgentRunOutput}
  }
  if (frame.type !== 'llm_request') throw new FrameError(`a frame of unknown type ${JSON.stringify(frame.type)}`)
  const id = frameId(frame)
  const request = frame.request
  if (!isObject(request)) throw new FrameError('an llm_request without a request object')
  const {system, messages, tools} = request
  if (typeof system !== 'string') throw new FrameError('an llm_request whose system is not a string')
  if (!Array.isArray(messages) || messages.length === 0)
    throw new FrameError('an llm_request whose messages are not a non-empty array')
  messages.forEach((message, index) => {
    const problem = chatMessageProblem(message)
    if (problem) throw new FrameError(`an llm_request whose messages[${index}] ${problem}`)
  })
  if (!Array.isArray(tools)) throw new FrameError('an llm_request whose tools are not an array')
  tools.forEach((tool, index) => {
    if (
      !isObject(tool) ||
      typeof tool.name !== 'string' ||
      typeof tool.description !== 'string' ||
      !isObject(tool.parameters)
    ) {
      throw new FrameError(`an llm_request whose tools[${index}] is not {name, description, parameters}`)
    }
  })
  // Only the fields the providers read travel on: nothing else the frame carried reaches an SDK.
  return {
    type: 'llm_request',
    id,
    request: {
      system,
      messages: messages as ChatMessage[],
      tools: (tools as ToolDefinition[]).map(({name, description, parameters}) => ({name, description, parameters})),
    },
  }
}

/**
 * What the gateway reads of a result (reply, usage, error...) must be there with its type: a
 * hostile agent-run must not crash it.
 */
function outputProblem(output: unknown): string | undefined {
  if (!isObject(output) || output.version !== 1 || typeof output.ok !== 'boolean') return 'not {version: 1, ok}'
  if (typeof output.run_id !== 'string') return 'run_id is not a string'
  const number = (value: unknown) => typeof value === 'number' && Number.isFinite(value)
  if (output.ok === false) {
    const error = output.error
    const valid =
      isObject(error) &&
      typeof error.code === 'string' &&
      typeof error.message === 'string' &&
      typeof error.retryable === 'boolean'
    return valid && (error.details === undefined || isObject(error.details))
      ? undefined
      : 'error is not {code, message, retryable}'
  }
  if (!isObject(output.reply) || typeof output.reply.content !== 'string') return 'reply is not {content}'
  if (
    typeof output.stop_reason !== 'string' ||
    !number(output.iterations) ||
    !number(output.ms) ||
    !Array.isArray(output.tool_calls)
  )
    return 'stop_reason, iterations, tool_calls or ms is missing'
  if (output.files !== undefined) {
    const files = output.files
    if (!Array.isArray(files) || files.length > MAX_FILES_IN_RESULT)
      return `files is not an array of at most ${MAX_FILES_IN_RESULT}`
    const bad = files.findIndex(
      (file) => !isObject(file) || typeof file.path !== 'string' || file.path.length > MAX_FILE_PATH_LENGTH,
    )
    if (bad !== -1) return `files[${bad}] is not {path} (a path of at most ${MAX_FILE_PATH_LENGTH} characters)`
  }
  const usage = output.usage
  return isObject(usage) && number(usage.input_tokens) && number(usage.output_tokens)
    ? undefined
    : 'usage is not {input_tokens, output_tokens}'
}

function chatMessageProblem(message: unknown): string | undefined {
  if (!isObject(message)) return 'is not an object'
  const text = (value: unknown) => typeof value === 'string'
  switch (message.role) {
    case 'user': {
      if (!text(message.content)) return 'has no string content'
      const images = message.images
      if (images === undefined) return undefined
      if (!Array.isArray(images) || images.length > MAX_IMAGES_PER_MESSAGE)
        return `has images that are not an array of at most ${MAX_IMAGES_PER_MESSAGE}`
      for (const [index, image] of images.entries()) {
        const problem = imageInputProblem(image)
        if (problem) return `has images[${index}] that ${problem}`
      }
      return undefined
    }
    case 'assistant': {
      if (!text(message.content)) return 'has no string content'
      const calls = message.tool_calls
      if (calls === undefined) return undefined
      if (!Array.isArray(calls)) return 'has tool_calls that are not an array'
      const bad = calls.findIndex(
        (call) => !isObject(call) || !text(call.id) || !text(call.name) || !isObject(call.arguments),
      )
      return bad === -1 ? undefined : `has tool_calls[${bad}] that is not {id, name, arguments}`
    }
    case 'tool':
      return text(message.tool_call_id) && text(message.name) && text(message.content)
        ? undefined
        : 'is a tool result without tool_call_id, name and content'
    default:
      return `has an unknown role ${JSON.stringify(message.role)}`
  }
}

/** agent-run side: one line from the runner after the input. */
export function parseLlmResponseFrame(line: string): LlmResponseFrame {
  const frame = parseFrame(line)
  if (frame.type !== 'llm_response') throw new FrameError(`a frame of unknown type ${JSON.stringify(frame.type)}`)
  const id = frameId(frame)
  if (frame.ok === true) {
    const response = frame.response
    if (
      !isObject(response) ||
      typeof response.content !== 'string' ||
      !Array.isArray(response.tool_calls) ||
      !isObject(response.usage)
    ) {
      throw new FrameError('an llm_response without a valid response object')
    }
    return {type: 'llm_response', id, ok: true, response: response as unknown as ChatResponse}
  }
  const error = frame.error
  if (frame.ok !== false || !isObject(error) || typeof error.code !== 'string' || typeof error.message !== 'string') {
    throw new FrameError('an llm_response that is neither ok with a response nor failed with an error')
  }
  return {type: 'llm_response', id, ok: false, error: error as unknown as LlmError}
}
