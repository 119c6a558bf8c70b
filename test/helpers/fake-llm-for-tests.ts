import {afterAll, beforeAll, beforeEach} from 'vitest'
import {startFakeLlm, type FakeLlm, type FakeRequest, type ScriptedTurn} from '../fakes/llm-server.js'

/**
 * One fake LLM for the tests of the file (or `describe` block) this is called in: started before
 * them and handed to `use`, closed after them. `resetBeforeEach` empties its script and request
 * log before every test, so no test sees another's turns.
 */
export function fakeLlmForTests(use: (llm: FakeLlm) => void, options: {resetBeforeEach?: boolean} = {}): void {
  let llm: FakeLlm | undefined
  beforeAll(async () => {
    llm = await startFakeLlm()
    use(llm)
  })
  afterAll(async () => {
    await llm?.close()
  })
  if (options.resetBeforeEach) beforeEach(() => llm?.reset())
}

/** "RUN: <command>" makes the agent run it in its shell, then answer with its output; anything else gets "pong". */
export function shellScripted(request: FakeRequest): ScriptedTurn {
  const messages = request.body.messages as Array<{role: string; content: unknown}>
  const last = messages.at(-1)
  if (last?.role === 'tool') return {text: `tool said: ${String(last.content)}`}
  const content = typeof last?.content === 'string' ? last.content : ''
  if (content.startsWith('RUN: '))
    return {toolCalls: [{name: 'shell', arguments: {command: content.slice(5), timeout_seconds: 60}}]}
  return {text: 'pong'}
}
