import type {AgentRunInput, AgentRunSuccess, ToolCallRecord, Usage} from '../shapes/agent-run-contract.js'
import type {Memory} from '../workspace/memory.js'
import type {ChatMessage, ChatResponse, ChatRequest} from '../shapes/provider-types.js'
import {attachmentsForModel, imageLimitFor} from './attachments.js'
import {buildSystemPrompt} from './prompt.js'
import {listSkills} from './skills.js'
import {runTool, TOOL_DEFINITIONS} from './tools.js'

export interface AgentLoopDeps {
  chat: (request: ChatRequest) => Promise<ChatResponse>
  memory: Memory
  redact: (text: string) => string
  log: (line: string) => void
  env: NodeJS.ProcessEnv
  signal?: AbortSignal
}

/** The agent loop: ask the model, run the tools it calls, repeat until a final answer or max_iterations. */
export async function runAgentLoop(input: AgentRunInput, deps: AgentLoopDeps): Promise<AgentRunSuccess> {
  const started = Date.now()
  const {agent, message, workspace} = input
  const channel = `${message.connector}:${message.channel_id}`
  const skills = await listSkills(workspace, deps.log)
  const system = buildSystemPrompt(agent, workspace, skills, message)
  const files = attachmentsForModel(workspace, message.attachments, imageLimitFor(input.providers, agent.provider))
  const userContent = [message.content, files.text].filter(Boolean).join('\n\n')
  const turn: ChatMessage[] = [
    {role: 'user', content: userContent, ...(files.images.length ? {images: files.images} : {})},
  ]
  const history = deps.memory.history(channel)
  const usage: Usage = {input_tokens: 0, output_tokens: 0}
  const toolCalls: ToolCallRecord[] = []
  const filesToSend: string[] = []
  let iterations = 0
  let reply: string | undefined
  let lastText = ''

  while (iterations < agent.max_iterations) {
    iterations++
    const response = await deps.chat({
      system,
      messages: [...history, ...turn],
      tools: TOOL_DEFINITIONS,
      signal: deps.signal,
    })
    usage.input_tokens += response.usage.input_tokens
    usage.output_tokens += response.usage.output_tokens
    const content = deps.redact(response.content)
    if (content) lastText = content
    if (response.tool_calls.length === 0) {
      reply = content
      turn.push({role: 'assistant', content})
      break
    }
    turn.push({role: 'assistant', content, tool_calls: response.tool_calls})
    for (const call of response.tool_calls) {
      const toolStarted = Date.now()
      const result = await runTool(call.name, call.arguments, {
        workspace,
        memory: deps.memory,
        env: deps.env,
        redact: deps.redact,
        signal: deps.signal,
        filesToSend,
      })
      const ms = Date.now() - toolStarted
      toolCalls.push({name: call.name, ok: result.ok, ms})
      deps.log(`tool ${call.name} ${result.ok ? 'ok' : 'failed'} in ${ms} ms`)
      turn.push({
        role: 'tool',
        tool_call_id: call.id,
        name: call.name,
        content: result.output,
        ...(result.ok ? {} : {is_error: true}),
      })
    }
  }

  const stopReason = reply === undefined ? 'max_iterations' : 'final'
  if (reply === undefined) {
    reply =
      `I stopped after ${iterations} steps, the limit for one message (max_iterations: ${agent.max_iterations}), before finishing.` +
      (lastText ? ` Where I got to: ${lastText}` : '')
    turn.push({role: 'assistant', content: reply})
  }
  try {
    // the images stay in the workspace: the history keeps the text that names them
    deps.memory.appendHistory(
      channel,
      turn.map((entry) => (entry.role === 'user' ? {role: 'user', content: entry.content} : entry)),
    )
  } catch (error) {
    // the reply is computed: a full disk or a broken memory.db costs the history, not the answer
    deps.log(
      `could not save this conversation to memory.db (the reply is delivered anyway): ${(error as Error).message}`,
    )
  }
  return {
    version: 1,
    ok: true,
    run_id: input.run_id,
    reply: {content: reply},
    stop_reason: stopReason,
    iterations,
    tool_calls: toolCalls,
    usage,
    ms: Date.now() - started,
    ...(filesToSend.length > 0 ? {files: filesToSend.map((file) => ({path: file}))} : {}),
  }
}
