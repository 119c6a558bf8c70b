import OpenAI from 'openai'
import {describe, expect, it} from 'vitest'
import {repairToolPairs} from '../../../src/runtime/providers/conversation.js'
import {createProviderChain} from '../../../src/runtime/providers/index.js'
import type {ChatMessage} from '../../../src/runtime/shapes/provider-types.js'
import type {FakeLlm} from '../../fakes/llm-server.js'
import {fakeLlmForTests} from '../../helpers/fake-llm-for-tests.js'
import {fakeProvider, providersConfig, SECRETS} from './helpers.js'

/** What bounded history looks like after its oldest messages were dropped mid-exchange. */
const CUT_HISTORY: ChatMessage[] = [
  {role: 'tool', tool_call_id: 'old-1', name: 'shell', content: 'output of a call whose request was dropped'},
  {role: 'assistant', content: 'Done with the old task.'},
  {role: 'user', content: 'new question'},
  {
    role: 'assistant',
    content: '',
    tool_calls: [
      {id: 'new-1', name: 'read_file', arguments: {path: 'a'}},
      {id: 'new-2', name: 'read_file', arguments: {path: 'b'}},
    ],
  },
  {role: 'tool', tool_call_id: 'new-1', name: 'read_file', content: 'contents of a'},
  // new-2's result was never stored (the run was killed)
  {role: 'tool', tool_call_id: 'stray', name: 'shell', content: 'answers nothing'},
  {role: 'user', content: 'and now?'},
]

describe('repairToolPairs', () => {
  it('drops the cut-off head and stray results, and answers unanswered calls', () => {
    expect(repairToolPairs(CUT_HISTORY)).toEqual([
      {role: 'user', content: 'new question'},
      CUT_HISTORY[3],
      CUT_HISTORY[4],
      {
        role: 'tool',
        tool_call_id: 'new-2',
        name: 'read_file',
        content: 'No result was recorded for this tool call.',
        is_error: true,
      },
      {role: 'user', content: 'and now?'},
    ])
  })

  it('leaves a well-formed conversation alone', () => {
    const fine: ChatMessage[] = [
      {role: 'user', content: 'q'},
      {role: 'assistant', content: 'calling', tool_calls: [{id: 'x', name: 'list_files', arguments: {}}]},
      {role: 'tool', tool_call_id: 'x', name: 'list_files', content: 'a\nb'},
      {role: 'assistant', content: 'two files'},
      {role: 'user', content: 'thanks'},
    ]
    expect(repairToolPairs(fine)).toEqual(fine)
  })
})

describe('cut history through the real SDKs', () => {
  let llm: FakeLlm
  fakeLlmForTests((started) => (llm = started), {resetBeforeEach: true})

  it('the fake refuses unpaired tool results, as the real API does', async () => {
    // Proves the next test can fail: without the repair, this is what a cut history gets.
    const client = new OpenAI({apiKey: 'k', baseURL: llm.openaiBaseUrl, maxRetries: 0})
    llm.setDefault({text: 'unreachable'})
    await expect(
      client.chat.completions.create({
        model: 'm',
        messages: [
          {role: 'tool', tool_call_id: 'old-1', content: 'x'},
          {role: 'user', content: 'q'},
        ],
      }),
    ).rejects.toMatchObject({status: 400})
  })

  it.each(['openai', 'anthropic'] as const)('a cut history is accepted by the %s wire format', async (api) => {
    llm.enqueue({text: 'fine'})
    const chain = createProviderChain(providersConfig('main', {main: fakeProvider(llm, api)}), SECRETS)
    const response = await chain.chat({system: 's', messages: CUT_HISTORY, tools: []})
    expect(response.content).toBe('fine')
    expect(llm.requests).toHaveLength(1)
  })
})
