import type {ChatMessage} from '../shapes/provider-types.js'

const MISSING_RESULT = 'No result was recorded for this tool call.'

/**
 * Makes a conversation acceptable to both APIs, which reject (HTTP 400, never retried) a tool
 * result without the call it answers and a tool call without its result. Stored history is
 * bounded and drops its oldest messages first, so a cut can land between a call and its result:
 * - leading messages before the first user message are dropped (a cut-off tail of older turns);
 * - a tool result whose call is not in the assistant message just before it is dropped;
 * - a tool call left unanswered gets a stand-in error result, so the model knows it has none.
 */
export function repairToolPairs(messages: ChatMessage[]): ChatMessage[] {
  const firstUser = messages.findIndex((message) => message.role === 'user')
  const repaired: ChatMessage[] = []
  let open = new Map<string, string>() // tool_call_id -> tool name, calls of the last assistant turn still unanswered

  const closeOpenCalls = () => {
    for (const [id, name] of open) {
      repaired.push({role: 'tool', tool_call_id: id, name, content: MISSING_RESULT, is_error: true})
    }
    open = new Map()
  }

  for (const message of firstUser === -1 ? messages : messages.slice(firstUser)) {
    if (message.role === 'tool') {
      if (!open.has(message.tool_call_id)) continue
      open.delete(message.tool_call_id)
      repaired.push(message)
      continue
    }
    closeOpenCalls()
    repaired.push(message)
    if (message.role === 'assistant') {
      open = new Map((message.tool_calls ?? []).map((call) => [call.id, call.name]))
    }
  }
  closeOpenCalls()
  return repaired
}
