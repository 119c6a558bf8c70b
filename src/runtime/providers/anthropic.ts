import {Anthropic} from '@anthropic-ai/sdk'
import type {
  ContentBlockParam,
  Message,
  MessageCreateParamsNonStreaming,
  MessageParam,
  Tool,
} from '@anthropic-ai/sdk/resources/messages/messages'

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

export const ANTHROPIC_DEFAULT_MAX_TOKENS = 4096

/** `kind: anthropic`: the Messages API through the official SDK. */
export function createAnthropicProvider(name: string, config: ProviderConfig, apiKey: string): ChatProvider {
  const client = new Anthropic({
    apiKey,
    baseURL: anthropicBaseUrl(config.base_url),
    ...sdkClientOptions(config),
  })

  return {
    name,
    config,
    preconnect: () => preconnect(client.baseURL),
    async chat(request: ChatRequest): Promise<ChatResponse> {
      const params = toMessagesParams(config, request)
      if (!config.stream) {
        try {
          return fromMessage(name, await client.messages.create(params, {signal: request.signal}))
        } catch (error) {
          throw failureFromSdkError(name, error, Anthropic)
        }
      }
      // A reply is complete only once message_stop arrived: a stream cut short (our timeout, a
      // dropped connection, a body that is not SSE) is a failed attempt, never a partial answer.
      const stream = client.messages.stream(params, {signal: request.signal})
      let stopped = false
      stream.on('streamEvent', (event) => {
        if (event.type === 'message_stop') stopped = true
      })
      let message: Message
      try {
        message = await stream.finalMessage()
      } catch (error) {
        const failure = failureFromSdkError(name, error, Anthropic)
        throw failure.retryable || failure.status !== null || request.signal?.aborted
          ? failure
          : incompleteStream(name, 'message_stop', error)
      }
      if (!stopped) throw incompleteStream(name, 'message_stop')
      return fromMessage(name, message)
    },
  }
}

/**
 * The SDK appends `/v1/messages` itself, while OpenAI-style base URLs end in `/v1`; operators copy
 * one style into the other, so a trailing `/v1` is taken off rather than requesting `/v1/v1/messages`.
 * Undefined keeps the SDK default (api.anthropic.com).
 */
export function anthropicBaseUrl(baseUrl: string | undefined): string | undefined {
  if (!baseUrl) return undefined
  return baseUrl.replace(/\/+$/, '').replace(/\/v1$/, '')
}

function toMessagesParams(config: ProviderConfig, request: ChatRequest): MessageCreateParamsNonStreaming {
  return {
    model: config.model,
    max_tokens: config.max_tokens ?? ANTHROPIC_DEFAULT_MAX_TOKENS,
    ...(request.system ? {system: request.system} : {}),
    messages: toAnthropicMessages(request.messages),
    ...(request.tools.length > 0 ? {tools: request.tools.map(toAnthropicTool)} : {}),
  }
}

function toAnthropicTool(tool: ToolDefinition): Tool {
  return {name: tool.name, description: tool.description, input_schema: tool.parameters as Tool.InputSchema}
}

/**
 * Tool results travel as `tool_result` blocks in a user message, and the API wants the roles to
 * alternate, so consecutive messages of one role (several tool results, or results followed by
 * the next user turn) are merged into one message of blocks.
 */
export function toAnthropicMessages(messages: ChatMessage[]): MessageParam[] {
  const converted: Array<{role: 'user' | 'assistant'; content: ContentBlockParam[]}> = []
  for (const message of repairToolPairs(messages)) {
    const role = message.role === 'assistant' ? 'assistant' : 'user'
    const blocks = toBlocks(message)
    if (blocks.length === 0) continue // the API rejects empty content
    const last = converted.at(-1)
    if (last && last.role === role) last.content.push(...blocks)
    else converted.push({role, content: blocks})
  }
  return converted
}

function toBlocks(message: ChatMessage): ContentBlockParam[] {
  switch (message.role) {
    case 'user':
      // images first: Anthropic's guidance is image before the text about it
      return [
        ...(message.images ?? []).map((image) => ({
          type: 'image' as const,
          source: {type: 'base64' as const, media_type: image.media_type, data: image.data},
        })),
        ...(message.content ? [{type: 'text' as const, text: message.content}] : []),
      ]
    case 'assistant':
      return [
        ...(message.content ? [{type: 'text' as const, text: message.content}] : []),
        ...(message.tool_calls ?? []).map((call) => ({
          type: 'tool_use' as const,
          id: call.id,
          name: call.name,
          input: call.arguments,
        })),
      ]
    case 'tool':
      return [
        {
          type: 'tool_result',
          tool_use_id: message.tool_call_id,
          // An empty tool_result is valid but leaves the model guessing; say so.
          content: message.content || '(no output)',
          ...(message.is_error ? {is_error: true} : {}),
        },
      ]
  }
}

function fromMessage(provider: string, message: Message): ChatResponse {
  if (!Array.isArray(message?.content) || !message.stop_reason) {
    throw new ProviderFailure(provider, 'the response is not a complete message (no content or stop_reason)', {
      retryable: true,
    })
  }
  const texts: string[] = []
  const toolCalls: ToolCall[] = []
  for (const block of message.content) {
    if (block.type === 'text') texts.push(block.text)
    else if (block.type === 'tool_use') {
      const input = block.input
      const isObject = typeof input === 'object' && input !== null && !Array.isArray(input)
      toolCalls.push({
        id: block.id,
        name: block.name,
        arguments: isObject ? (input as Record<string, unknown>) : {},
        ...(isObject ? {} : {invalid_arguments: JSON.stringify(input)}),
      })
    }
  }
  const usage = message.usage
  return {
    content: texts.join('\n'),
    tool_calls: toolCalls,
    usage: {
      input_tokens:
        (usage?.input_tokens ?? 0) + (usage?.cache_creation_input_tokens ?? 0) + (usage?.cache_read_input_tokens ?? 0),
      output_tokens: usage?.output_tokens ?? 0,
    },
    provider,
    model: message.model,
    ...(message.stop_reason ? {stop_reason: message.stop_reason} : {}),
  }
}
