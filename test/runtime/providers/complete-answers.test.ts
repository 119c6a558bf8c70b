import {describe, expect, it} from 'vitest'
import {createProviderChain} from '../../../src/runtime/providers/index.js'
import type {FakeLlm} from '../../fakes/llm-server.js'
import {fakeLlmForTests} from '../../helpers/fake-llm-for-tests.js'
import {fakeProvider, gatewayErrorOf, providersConfig, SECRETS, userRequest} from './helpers.js'

let llm: FakeLlm
fakeLlmForTests((started) => (llm = started), {resetBeforeEach: true})

const QUICK = {baseDelayMs: 1}
const CASES = [
  {api: 'openai', stream: false},
  {api: 'openai', stream: true},
  {api: 'anthropic', stream: false},
  {api: 'anthropic', stream: true},
] as const

// Issue 14.3: a reply is complete or it is an error, never the part that arrived.
describe('an answer that does not complete is a failed, retried attempt', () => {
  it.each(CASES)(
    'cut off before its terminal event, then answered in full ($api, stream: $stream)',
    async ({api, stream}) => {
      const chain = createProviderChain(
        providersConfig('main', {main: fakeProvider(llm, api, {stream})}),
        SECRETS,
        {},
        QUICK,
      )
      llm.enqueue({text: 'half an answ', incomplete: 'truncate'}, {text: 'the whole answer'})
      expect((await chain.chat(userRequest('hi'))).content).toBe('the whole answer')
      expect(llm.requests).toHaveLength(2)
    },
  )

  it.each(CASES)('a 200 whose body is garbage, then answered ($api, stream: $stream)', async ({api, stream}) => {
    const chain = createProviderChain(
      providersConfig('main', {main: fakeProvider(llm, api, {stream})}),
      SECRETS,
      {},
      QUICK,
    )
    llm.enqueue({text: 'x', incomplete: 'garbage'}, {text: 'parsed fine'})
    expect((await chain.chat(userRequest('hi'))).content).toBe('parsed fine')
    expect(llm.requests).toHaveLength(2)
  })

  it.each(CASES)(
    'when every attempt is cut off: E_PROVIDER, retryable, no reply ($api, stream: $stream)',
    async ({api, stream}) => {
      const chain = createProviderChain(
        providersConfig('main', {main: fakeProvider(llm, api, {stream, max_retries: 1})}),
        SECRETS,
        {},
        QUICK,
      )
      llm.setDefault({text: 'partial text that must not become a reply', incomplete: 'truncate'})
      const error = await gatewayErrorOf(chain.chat(userRequest('hi')))
      expect(error.code).toBe('E_PROVIDER')
      expect(error.retryable).toBe(true)
      expect(error.message).toMatch(/2 attempts/)
      expect(llm.requests).toHaveLength(2)
    },
  )

  it.each(CASES)(
    'a stream slower than timeout_seconds is aborted by our timeout and retried, never returned half ($api, stream: $stream)',
    async ({api, stream}) => {
      const chain = createProviderChain(
        providersConfig('main', {main: fakeProvider(llm, api, {stream, timeout_seconds: 1})}),
        SECRETS,
        {},
        QUICK,
      )
      llm.enqueue({text: 'slow start', incomplete: 'stall', stallMs: 5_000}, {text: 'on time'})
      const started = Date.now()
      expect((await chain.chat(userRequest('hi'))).content).toBe('on time')
      expect(Date.now() - started).toBeLessThan(4_000)
      expect(llm.requests).toHaveLength(2)
    },
  )
})
