import {describe, expect, it} from 'vitest'
import {createProviderChain} from '../../../src/runtime/providers/index.js'
import type {ChatMessage} from '../../../src/runtime/shapes/provider-types.js'
import {type FakeApi, type FakeLlm, presentedKey, startFakeLlm} from '../../fakes/llm-server.js'
import {fakeLlmForTests} from '../../helpers/fake-llm-for-tests.js'
import {fakeProvider, providersConfig, SECRETS, userRequest, WRITE_FILE_TOOL} from './helpers.js'

let llm: FakeLlm
fakeLlmForTests((started) => (llm = started), {resetBeforeEach: true})

const MODES: Array<{api: FakeApi; stream: boolean}> = [
  {api: 'openai', stream: false},
  {api: 'openai', stream: true},
  {api: 'anthropic', stream: false},
  {api: 'anthropic', stream: true},
]

describe.each(MODES)('tool calling through the real $api SDK (stream: $stream)', ({api, stream}) => {
  const chain = () => createProviderChain(providersConfig('main', {main: fakeProvider(llm, api, {stream})}), SECRETS)

  it('returns the tool call, then sends its result back in the wire shape of the API', async () => {
    const providers = chain()
    llm.enqueue(
      {
        text: 'Writing it now.',
        toolCalls: [{name: 'write_file', arguments: {path: 'notes/a.txt', content: 'hello "world"\n'}}],
        usage: {input_tokens: 21, output_tokens: 7},
      },
      {text: 'The file is written.', usage: {input_tokens: 40, output_tokens: 5}},
    )

    const first = await providers.chat(userRequest('write a file', [WRITE_FILE_TOOL]))
    expect(first.content).toBe('Writing it now.')
    expect(first.tool_calls).toHaveLength(1)
    expect(first.tool_calls[0]).toMatchObject({
      name: 'write_file',
      arguments: {path: 'notes/a.txt', content: 'hello "world"\n'},
    })
    expect(first.tool_calls[0].id).toMatch(/\S/)
    expect(first.usage).toEqual({input_tokens: 21, output_tokens: 7})
    expect(first.provider).toBe('main')

    const call = first.tool_calls[0]
    const history: ChatMessage[] = [
      {role: 'user', content: 'write a file'},
      {role: 'assistant', content: first.content, tool_calls: first.tool_calls},
      {role: 'tool', tool_call_id: call.id, name: call.name, content: 'wrote 14 bytes to notes/a.txt'},
    ]
    const second = await providers.chat({system: 'You are a test agent.', messages: history, tools: [WRITE_FILE_TOOL]})
    expect(second.content).toBe('The file is written.')
    expect(second.tool_calls).toEqual([])
    expect(second.usage).toEqual({input_tokens: 40, output_tokens: 5})

    expect(llm.requests).toHaveLength(2)
    for (const request of llm.requests) {
      expect(request.api).toBe(api)
      expect(request.stream).toBe(stream)
    }
    const body = llm.requests[1].body
    if (api === 'openai') {
      expect(llm.requests[1].headers.authorization).toBe(`Bearer ${SECRETS.TEST_OPENAI_KEY}`)
      expect(body.model).toBe('gpt-test')
      expect(body.tools).toEqual([
        {
          type: 'function',
          function: {
            name: 'write_file',
            description: WRITE_FILE_TOOL.description,
            parameters: WRITE_FILE_TOOL.parameters,
          },
        },
      ])
      expect(body.messages).toEqual([
        {role: 'system', content: 'You are a test agent.'},
        {role: 'user', content: 'write a file'},
        {
          role: 'assistant',
          content: 'Writing it now.',
          tool_calls: [
            {id: call.id, type: 'function', function: {name: 'write_file', arguments: JSON.stringify(call.arguments)}},
          ],
        },
        {role: 'tool', tool_call_id: call.id, content: 'wrote 14 bytes to notes/a.txt'},
      ])
      if (stream) expect(body.stream_options).toEqual({include_usage: true})
    } else {
      expect(presentedKey(llm.requests[1])).toBe(SECRETS.TEST_ANTHROPIC_KEY)
      expect(body.model).toBe('claude-test')
      expect(body.max_tokens).toBe(4096)
      expect(body.system).toBe('You are a test agent.')
      expect(body.tools).toEqual([
        {name: 'write_file', description: WRITE_FILE_TOOL.description, input_schema: WRITE_FILE_TOOL.parameters},
      ])
      expect(body.messages).toEqual([
        {role: 'user', content: [{type: 'text', text: 'write a file'}]},
        {
          role: 'assistant',
          content: [
            {type: 'text', text: 'Writing it now.'},
            {type: 'tool_use', id: call.id, name: 'write_file', input: call.arguments},
          ],
        },
        {
          role: 'user',
          content: [{type: 'tool_result', tool_use_id: call.id, content: 'wrote 14 bytes to notes/a.txt'}],
        },
      ])
    }
  })

  it('assembles several tool calls in one answer, in order', async () => {
    llm.enqueue({
      toolCalls: [
        {name: 'read_file', arguments: {path: 'a.txt'}},
        {name: 'list_files', arguments: {}},
        {name: 'shell', arguments: {command: 'echo {"nested": [1, 2]}', timeout_seconds: 5}},
      ],
    })
    const response = await chain().chat(userRequest('do three things', [WRITE_FILE_TOOL]))
    expect(response.content).toBe('')
    expect(response.tool_calls.map((call) => [call.name, call.arguments])).toEqual([
      ['read_file', {path: 'a.txt'}],
      ['list_files', {}],
      ['shell', {command: 'echo {"nested": [1, 2]}', timeout_seconds: 5}],
    ])
    expect(new Set(response.tool_calls.map((call) => call.id)).size).toBe(3)
    expect(response.stop_reason).toBe(api === 'openai' ? 'tool_calls' : 'tool_use')
  })

  it('sends the results of several calls back together, paired by id', async () => {
    llm.enqueue({text: 'both done'})
    const history: ChatMessage[] = [
      {role: 'user', content: 'two things'},
      {
        role: 'assistant',
        content: '',
        tool_calls: [
          {id: 'c1', name: 'read_file', arguments: {path: 'x'}},
          {id: 'c2', name: 'shell', arguments: {command: 'false'}},
        ],
      },
      {role: 'tool', tool_call_id: 'c1', name: 'read_file', content: 'contents of x'},
      {role: 'tool', tool_call_id: 'c2', name: 'shell', content: 'exit code 1', is_error: true},
    ]
    const response = await chain().chat({system: '', messages: history, tools: []})
    expect(response.content).toBe('both done')

    const {body} = llm.requests[0]
    if (api === 'openai') {
      expect(body.messages.map((message: {role: string}) => message.role)).toEqual([
        'user',
        'assistant',
        'tool',
        'tool',
      ])
      expect(body.messages[1].content).toBeNull()
      expect(body.tools).toBeUndefined()
    } else {
      expect(body.system).toBeUndefined()
      expect(body.messages).toHaveLength(3)
      expect(body.messages[2].content).toEqual([
        {type: 'tool_result', tool_use_id: 'c1', content: 'contents of x'},
        {type: 'tool_result', tool_use_id: 'c2', content: 'exit code 1', is_error: true},
      ])
    }
  })
})

describe('malformed tool arguments', () => {
  it('reports arguments that are not a JSON object instead of guessing', async () => {
    const llm2 = await startFakeLlm()
    try {
      llm2.enqueue({toolCalls: [{name: 'shell', arguments: '{"command": "ls"'}]})
      const chain = createProviderChain(providersConfig('main', {main: fakeProvider(llm2, 'openai')}), SECRETS)
      const response = await chain.chat(userRequest('list'))
      expect(response.tool_calls[0]).toMatchObject({
        name: 'shell',
        arguments: {},
        invalid_arguments: '{"command": "ls"',
      })
    } finally {
      await llm2.close()
    }
  })
})
