import {OpenAI} from 'openai'
import type {
  ChatCompletion,
  ChatCompletionChunk,
  ChatCompletionCreateParamsNonStreaming,
  ChatCompletionMessageParam,
  ChatCompletionFunctionTool,
} from 'openai/resources/chat/completions/completions'

import type {ProviderConfig} from '../config/types.js'
import {repairToolPairs} from './conversation.js'
import {failureFromSdkError, incompleteStream, ProviderFailure} from './failure.js'
import {preconnect, sdkClientOptions} from './http-fetch.js'
import type {
  ChatMessage,
  ChatProvider,
  ChatRequest,
  ChatResponse,
  ToolCall,
  ToolDefinition,
} from '../shapes/provider-types.js'

/**
 * `kind: openai`: Chat Completions through the official SDK, against api.openai.com or any
 * compatible server named by `base_url` (Ollama, vLLM, llama.cpp).
 */
export function createOpenAiProvider(name: string, config: ProviderConfig, apiKey: string): ChatProvider {
  const client = new OpenAI({
    apiKey,
    baseURL: config.base_url || undefined,
    // Explicit nulls: the SDK would otherwise read OPENAI_ORG_ID / OPENAI_PROJECT_ID from our environment.
    organization: null,
    project: null,
    ...sdkClientOptions(config),
  })

  return {
    name,
    config,
    preconnect: () => preconnect(client.baseURL),
    async chat(request: ChatRequest): Promise<ChatResponse> {
      const params = toCompletionParams(config, request)
      let assembler: StreamAssembler | undefined
      try {
        if (!config.stream) {
          const completion = await client.chat.completions.create(params, {signal: request.signal})
          return fromCompletion(name, config, completion)
        }
        const stream = await client.chat.completions.create(
          {...params, stream: true, stream_options: {include_usage: true}},
          {signal: request.signal},
        )
        assembler = new StreamAssembler()
        // The SDK ends the iteration quietly when the signal aborts (our timeout): completeness is checked below.
        for await (const chunk of stream) assembler.add(chunk)
      } catch (error) {
        const failure = failureFromSdkError(name, error, OpenAI)
        throw !assembler || failure.retryable || failure.status !== null || request.signal?.aborted
          ? failure
          : incompleteStream(name, 'its finish_reason', error)
      }
      // A reply is complete only once a finish_reason arrived: otherwise the stream was cut short.
      if (!assembler.finished) throw incompleteStream(name, 'its finish_reason')
      return assembler.response(name, config)
    },
  }
}

function toCompletionParams(config: ProviderConfig, request: ChatRequest): ChatCompletionCreateParamsNonStreaming {
  return {
    model: config.model,
    messages: toOpenAiMessages(request.system, request.messages),
    ...(request.tools.length > 0 ? {tools: request.tools.map(toOpenAiTool)} : {}),
    // Sent only when configured: `max_tokens` is what every compatible server understands, while
    // api.openai.com's reasoning models reject it; leaving it out lets each server use its default.
    ...(config.max_tokens === undefined ? {} : {max_tokens: config.max_tokens}),
  }
}

function toOpenAiTool(tool: ToolDefinition): ChatCompletionFunctionTool {
  return {type: 'function', function: {name: tool.name, description: tool.description, parameters: tool.parameters}}
}

export function toOpenAiMessages(system: string, messages: ChatMessage[]): ChatCompletionMessageParam[] {
  const converted: ChatCompletionMessageParam[] = system ? [{role: 'system', content: system}] : []
  for (const message of repairToolPairs(messages)) {
    switch (message.role) {
      case 'user':
        converted.push({
          role: 'user',
          content: message.images?.length
            ? [
                {type: 'text', text: message.content},
                ...message.images.map((image) => ({
                  type: 'image_url' as const,
                  image_url: {url: `data:${image.media_type};base64,${image.data}`},
                })),
              ]
            : message.content,
        })
        break
      case 'assistant':
        converted.push({
          role: 'assistant',
          // null, not '', alongside tool calls: some compatible servers reject an empty string.
          content: message.content || (message.tool_calls?.length ? null : ''),
          ...(message.tool_calls?.length
            ? {
                tool_calls: message.tool_calls.map((call) => ({
                  id: call.id,
                  type: 'function' as const,
                  function: {name: call.name, arguments: JSON.stringify(call.arguments)},
                })),
              }
            : {}),
        })
        break
      case 'tool':
        converted.push({role: 'tool', tool_call_id: message.tool_call_id, content: message.content || '(no output)'})
        break
    }
  }
  return converted
}

function fromCompletion(provider: string, config: ProviderConfig, completion: ChatCompletion): ChatResponse {
  const choice = completion?.choices?.[0]
  if (!choice?.message) {
    throw new ProviderFailure(provider, 'the response has no choices', {retryable: true})
  }
  const toolCalls = (choice.message.tool_calls ?? []).flatMap((call, index) =>
    call.type === 'function' ? [toolCall(call.id, call.function.name, call.function.arguments, index)] : [],
  )
  return {
    content: choice.message.content ?? '',
    tool_calls: toolCalls,
    usage: {
      input_tokens: completion.usage?.prompt_tokens ?? 0,
      output_tokens: completion.usage?.completion_tokens ?? 0,
    },
    provider,
    model: completion.model || config.model,
    ...(choice.finish_reason ? {stop_reason: choice.finish_reason} : {}),
  }
}

/** Arguments arrive as JSON text; a model can produce text that is not a JSON object. */
function toolCall(id: string | undefined, name: string, argumentsText: string, index: number): ToolCall {
  // Some compatible servers omit ids; the next request must still pair results with calls.
  const callId = id || `call_${index}`
  const text = argumentsText.trim() === '' ? '{}' : argumentsText
  try {
    const parsed: unknown = JSON.parse(text)
    if (typeof parsed === 'object' && parsed !== null && !Array.isArray(parsed)) {
      return {id: callId, name, arguments: parsed as Record<string, unknown>}
    }
  } catch {
    // reported through invalid_arguments below
  }
  return {id: callId, name, arguments: {}, invalid_arguments: argumentsText}
}

/** Builds one ChatResponse from streamed chunks; tool calls arrive in pieces keyed by index. */
class StreamAssembler {
  private content = ''
  private model = ''
  private finishReason: string | undefined
  private usage = {input_tokens: 0, output_tokens: 0}
  private readonly calls = new Map<number, {id: string; name: string; arguments: string}>()

  add(chunk: ChatCompletionChunk): void {
    if (chunk.model) this.model = chunk.model
    if (chunk.usage) {
      this.usage = {input_tokens: chunk.usage.prompt_tokens ?? 0, output_tokens: chunk.usage.completion_tokens ?? 0}
    }
    const choice = chunk.choices?.[0]
    if (!choice) return
    if (choice.delta?.content) this.content += choice.delta.content
    for (const delta of choice.delta?.tool_calls ?? []) {
      const call = this.calls.get(delta.index) ?? {id: '', name: '', arguments: ''}
      if (delta.id) call.id = delta.id
      if (delta.function?.name) call.name += delta.function.name
      if (delta.function?.arguments) call.arguments += delta.function.arguments
      this.calls.set(delta.index, call)
    }
    if (choice.finish_reason) this.finishReason = choice.finish_reason
  }

  get finished(): boolean {
    return this.finishReason !== undefined
  }

  response(provider: string, config: ProviderConfig): ChatResponse {
    const ordered = [...this.calls.entries()].sort(([a], [b]) => a - b)
    return {
      content: this.content,
      tool_calls: ordered.map(([index, call]) => toolCall(call.id, call.name, call.arguments, index)),
      usage: this.usage,
      provider,
      model: this.model || config.model,
      ...(this.finishReason ? {stop_reason: this.finishReason} : {}),
    }
  }
}
