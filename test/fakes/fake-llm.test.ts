import Anthropic from '@anthropic-ai/sdk'
import OpenAI from 'openai'
import {afterAll, beforeAll, beforeEach, describe, expect, it} from 'vitest'
import {type FakeLlm, startFakeLlm} from './llm-server.js'

/** The fake's own contract, which the agent and gateway end-to-end tests rely on. */
describe('fake LLM server', () => {
  let llm: FakeLlm
  let openai: OpenAI
  let anthropic: Anthropic
  beforeAll(async () => {
    llm = await startFakeLlm()
    openai = new OpenAI({apiKey: 'sk-o', baseURL: llm.openaiBaseUrl, maxRetries: 0})
    anthropic = new Anthropic({apiKey: 'sk-a', baseURL: llm.anthropicBaseUrl, maxRetries: 0})
  })
  afterAll(async () => {
    await llm.close()
  })
  beforeEach(() => llm.reset())

  const askOpenAi = () => openai.chat.completions.create({model: 'gpt-x', messages: [{role: 'user', content: 'hi'}]})
  const askAnthropic = () =>
    anthropic.messages.create({model: 'claude-x', max_tokens: 50, messages: [{role: 'user', content: 'hi'}]})

  it('listens on 127.0.0.1 only', () => {
    expect(llm.openaiBaseUrl).toBe(`http://127.0.0.1:${llm.port}/v1`)
    expect(llm.anthropicBaseUrl).toBe(`http://127.0.0.1:${llm.port}`)
  })

  it('answers in order from one queue shared by both APIs, and logs every request', async () => {
    llm.enqueue({text: 'first'}, {text: 'second'})
    expect(llm.pending).toBe(2)
    expect((await askAnthropic()).content).toEqual([{type: 'text', text: 'first'}])
    expect((await askOpenAi()).choices[0].message.content).toBe('second')
    expect(llm.pending).toBe(0)
    expect(llm.requests.map((request) => [request.api, request.path, request.body.model])).toEqual([
      ['anthropic', '/v1/messages', 'claude-x'],
      ['openai', '/v1/chat/completions', 'gpt-x'],
    ])
  })

  it('answers 500 "no scripted response" when the queue is empty and no default is set', async () => {
    await expect(askOpenAi()).rejects.toMatchObject({
      status: 500,
      message: expect.stringContaining('fake LLM: no scripted response'),
    })
    await expect(askAnthropic()).rejects.toMatchObject({
      status: 500,
      message: expect.stringContaining('fake LLM: no scripted response'),
    })
  })

  it('answers the default turn, as often as asked, once the queue is empty', async () => {
    llm.setDefault({text: 'ok'})
    for (let index = 0; index < 3; index++) expect((await askOpenAi()).choices[0].message.content).toBe('ok')
  })

  it('lets a function turn answer from the request', async () => {
    llm.enqueue((request) => ({text: `you said ${request.body.messages.at(-1).content} via ${request.api}`}))
    expect((await askOpenAi()).choices[0].message.content).toBe('you said hi via openai')
  })

  it("sends errors in each API's own shape, so the SDKs raise their typed errors", async () => {
    llm.enqueue({status: 429, message: 'slow down'}, {status: 529, message: 'busy'})
    await expect(askOpenAi()).rejects.toBeInstanceOf(OpenAI.RateLimitError)
    const error = await askAnthropic().catch((caught: unknown) => caught)
    expect(error).toBeInstanceOf(Anthropic.APIError)
    expect(error).toMatchObject({
      status: 529,
      error: {type: 'error', error: {type: 'overloaded_error', message: 'busy'}},
    })
  })

  it('checks the API key when asked to, answering 401', async () => {
    llm.requireApiKey('sk-a')
    llm.setDefault({text: 'ok'})
    expect((await askAnthropic()).content).toEqual([{type: 'text', text: 'ok'}])
    await expect(askOpenAi()).rejects.toBeInstanceOf(OpenAI.AuthenticationError)
  })

  it('answers 404 for paths it does not serve', async () => {
    const response = await fetch(`${llm.openaiBaseUrl}/embeddings`, {method: 'POST', body: '{}'})
    expect(response.status).toBe(404)
  })
})
