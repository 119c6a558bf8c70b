import {describe, expect, it} from 'vitest'
import {createProviderChain} from '../../../src/runtime/providers/index.js'
import type {FakeLlm} from '../../fakes/llm-server.js'
import {fakeLlmForTests} from '../../helpers/fake-llm-for-tests.js'
import {closedPort, fakeProvider, gatewayErrorOf, providersConfig, SECRETS, userRequest} from './helpers.js'

let llm: FakeLlm
fakeLlmForTests((started) => (llm = started), {resetBeforeEach: true})

/** Backoff of ~1 ms so the retry tests measure the policy, not the waiting. */
const QUICK = {baseDelayMs: 1}

describe('retries', () => {
  it.each([
    {api: 'openai', stream: false},
    {api: 'openai', stream: true},
    {api: 'anthropic', stream: false},
    {api: 'anthropic', stream: true},
  ] as const)('retries a 500 and returns the answer that follows ($api, stream: $stream)', async ({api, stream}) => {
    const chain = createProviderChain(
      providersConfig('main', {main: fakeProvider(llm, api, {stream})}),
      SECRETS,
      {},
      QUICK,
    )
    llm.enqueue({status: 500}, {text: 'recovered'})
    const response = await chain.chat(userRequest('hi'))
    expect(response.content).toBe('recovered')
    expect(llm.requests).toHaveLength(2)
  })

  it('retries 529 overloaded on the Anthropic API', async () => {
    const chain = createProviderChain(
      providersConfig('main', {main: fakeProvider(llm, 'anthropic')}),
      SECRETS,
      {},
      QUICK,
    )
    llm.enqueue({status: 529}, {status: 503}, {text: 'recovered'})
    expect((await chain.chat(userRequest('hi'))).content).toBe('recovered')
    expect(llm.requests).toHaveLength(3)
  })

  it.each(['openai', 'anthropic'] as const)(
    'never retries a 400 (%s): one request, and the error names the provider',
    async (api) => {
      const chain = createProviderChain(
        providersConfig('main-llm', {'main-llm': fakeProvider(llm, api)}),
        SECRETS,
        {},
        QUICK,
      )
      llm.enqueue({status: 400, message: 'prompt is too long'}, {text: 'must not be reached'})
      const error = await gatewayErrorOf(chain.chat(userRequest('hi')))
      expect(llm.requests).toHaveLength(1)
      expect(error.code).toBe('E_PROVIDER')
      expect(error.message).toContain('main-llm')
      expect(error.message).toContain('HTTP 400')
      expect(error.message).toContain('prompt is too long')
      expect(error.retryable).toBe(false)
      expect(error.details.attempts).toEqual([
        {provider: 'main-llm', status: 400, message: 'HTTP 400: prompt is too long'},
      ])
    },
  )

  it('does not retry a 401 either, and points at the key variable', async () => {
    llm.requireApiKey('the-right-key')
    const chain = createProviderChain(providersConfig('main', {main: fakeProvider(llm, 'openai')}), SECRETS, {}, QUICK)
    const error = await gatewayErrorOf(chain.chat(userRequest('hi')))
    expect(llm.requests).toHaveLength(1)
    expect(error.message).toContain('HTTP 401')
    expect(error.suggestions.join(' ')).toContain('TEST_OPENAI_KEY')
  })

  it('gives up after 1 + max_retries attempts (default 2 retries)', async () => {
    const chain = createProviderChain(
      providersConfig('main', {main: fakeProvider(llm, 'anthropic')}),
      SECRETS,
      {},
      QUICK,
    )
    llm.setDefault({status: 500, message: 'upstream exploded'})
    const error = await gatewayErrorOf(chain.chat(userRequest('hi')))
    expect(llm.requests).toHaveLength(3)
    expect(error.code).toBe('E_PROVIDER')
    expect(error.retryable).toBe(true)
    expect(error.message).toBe('LLM provider main failed: HTTP 500: upstream exploded (3 attempts)')
  })

  it('honours max_retries from the provider config', async () => {
    const chain = createProviderChain(
      providersConfig('main', {main: fakeProvider(llm, 'openai', {max_retries: 0})}),
      SECRETS,
      {},
      QUICK,
    )
    llm.setDefault({status: 502})
    await gatewayErrorOf(chain.chat(userRequest('hi')))
    expect(llm.requests).toHaveLength(1)
  })

  it('waits as long as a 429 Retry-After asks before retrying', async () => {
    const chain = createProviderChain(providersConfig('main', {main: fakeProvider(llm, 'openai')}), SECRETS, {}, QUICK)
    llm.enqueue({status: 429, headers: {'retry-after': '1'}}, {text: 'after the wait'})
    const response = await chain.chat(userRequest('hi'))
    expect(response.content).toBe('after the wait')
    expect(llm.requests).toHaveLength(2)
    const waited = llm.requests[1].time - llm.requests[0].time
    expect(waited).toBeGreaterThanOrEqual(950)
    expect(waited).toBeLessThan(3000)
  })

  it('moves on instead of waiting when Retry-After is beyond the cap', async () => {
    const providers = providersConfig('a', {a: fakeProvider(llm, 'anthropic'), b: fakeProvider(llm, 'openai')}, ['b'])
    const chain = createProviderChain(providers, SECRETS, {}, QUICK)
    llm.enqueue({status: 429, headers: {'retry-after': '3600'}}, {text: 'from b'})
    const started = Date.now()
    const response = await chain.chat(userRequest('hi'))
    expect(Date.now() - started).toBeLessThan(2000)
    expect(response.provider).toBe('b')
    expect(llm.requests.map((request) => request.api)).toEqual(['anthropic', 'openai'])
  })

  it('retries a network error (nothing listening), then fails with E_PROVIDER saying why', async () => {
    const port = await closedPort()
    const config = {kind: 'openai' as const, model: 'm', base_url: `http://127.0.0.1:${port}/v1`}
    const chain = createProviderChain(providersConfig('local', {local: config}), {}, {}, QUICK)
    const error = await gatewayErrorOf(chain.chat(userRequest('hi')))
    expect(error.code).toBe('E_PROVIDER')
    expect(error.retryable).toBe(true)
    const attempts = error.details.attempts as Array<{provider: string; status: number | null; message: string}>
    expect(attempts).toHaveLength(3)
    for (const attempt of attempts) {
      expect(attempt.status).toBeNull()
      expect(attempt.message).toContain('ECONNREFUSED')
    }
    expect(error.message).toContain('LLM provider local failed: network error: connect ECONNREFUSED')
    expect(error.suggestions.join(' ')).toContain(`127.0.0.1:${port}`)
  })

  it.each(['openai', 'anthropic'] as const)(
    'retries a stream that breaks off with an error event (%s)',
    async (api) => {
      const chain = createProviderChain(
        providersConfig('main', {main: fakeProvider(llm, api, {stream: true})}),
        SECRETS,
        {},
        QUICK,
      )
      llm.enqueue({text: 'partial', streamError: 'Overloaded'}, {text: 'whole answer'})
      expect((await chain.chat(userRequest('hi'))).content).toBe('whole answer')
      expect(llm.requests).toHaveLength(2)
    },
  )

  it('retries a dropped connection', async () => {
    const chain = createProviderChain(
      providersConfig('main', {main: fakeProvider(llm, 'anthropic')}),
      SECRETS,
      {},
      QUICK,
    )
    llm.enqueue({disconnect: true}, {text: 'second time lucky'})
    expect((await chain.chat(userRequest('hi'))).content).toBe('second time lucky')
    expect(llm.requests).toHaveLength(2)
  })

  it.each([false, true])('times a slow answer out after timeout_seconds and retries (stream: %s)', async (stream) => {
    const chain = createProviderChain(
      providersConfig('main', {main: fakeProvider(llm, 'openai', {timeout_seconds: 0.3, stream})}),
      SECRETS,
      {},
      QUICK,
    )
    llm.enqueue({delayMs: 5000, text: 'too late'}, {text: 'in time'})
    const started = Date.now()
    const response = await chain.chat(userRequest('hi'))
    expect(response.content).toBe('in time')
    expect(Date.now() - started).toBeLessThan(2000)
    expect(llm.requests).toHaveLength(2)
  })

  it('says which timeout expired when every attempt is too slow', async () => {
    const chain = createProviderChain(
      providersConfig('slow', {slow: fakeProvider(llm, 'anthropic', {timeout_seconds: 0.2, max_retries: 0})}),
      SECRETS,
      {},
      QUICK,
    )
    llm.enqueue({delayMs: 5000, text: 'too late'})
    const error = await gatewayErrorOf(chain.chat(userRequest('hi')))
    expect(error.message).toBe('LLM provider slow failed: no answer within 0.2s (timeout_seconds) (1 attempt)')
    expect(error.retryable).toBe(true)
  })

  it('stops at once when the caller cancels, without further attempts', async () => {
    const chain = createProviderChain(providersConfig('main', {main: fakeProvider(llm, 'openai')}), SECRETS, {}, QUICK)
    llm.setDefault({delayMs: 5000, text: 'never'})
    const controller = new AbortController()
    setTimeout(() => controller.abort(new Error('agent-run deadline')), 100)
    const started = Date.now()
    const error = await gatewayErrorOf(chain.chat({...userRequest('hi'), signal: controller.signal}))
    expect(Date.now() - started).toBeLessThan(2000)
    expect(error.message).toContain('cancelled')
    expect(error.retryable).toBe(false)
    expect(llm.requests).toHaveLength(1)
  })
})

describe('fallback', () => {
  it('after the primary answers 500 three times, the fallback answers', async () => {
    const providers = providersConfig(
      'claude',
      {claude: fakeProvider(llm, 'anthropic'), gpt: fakeProvider(llm, 'openai')},
      ['gpt'],
    )
    const chain = createProviderChain(providers, SECRETS, {}, QUICK)
    expect(chain.order).toEqual(['claude', 'gpt'])
    llm.enqueue({status: 500}, {status: 500}, {status: 500}, {text: 'the fallback speaks'})
    const response = await chain.chat(userRequest('hi'))
    expect(response.content).toBe('the fallback speaks')
    expect(response.provider).toBe('gpt')
    expect(response.model).toBe('gpt-test')
    expect(llm.requests.map((request) => request.api)).toEqual(['anthropic', 'anthropic', 'anthropic', 'openai'])
  })

  it('tries each fallback in order and names every provider in the final error', async () => {
    const providers = providersConfig(
      'one',
      {
        one: fakeProvider(llm, 'anthropic'),
        two: fakeProvider(llm, 'openai', {max_retries: 1}),
        three: fakeProvider(llm, 'openai'),
      },
      ['two', 'three'],
    )
    const chain = createProviderChain(providers, SECRETS, {}, QUICK)
    llm.enqueue(
      {status: 500, message: 'one is down'},
      {status: 500, message: 'one is down'},
      {status: 500, message: 'one is down'},
      {status: 503, message: 'two is busy'},
      {status: 503, message: 'two is busy'},
      {status: 404, message: 'model not found'},
    )
    const error = await gatewayErrorOf(chain.chat(userRequest('hi')))
    expect(llm.requests).toHaveLength(6)
    expect(error.code).toBe('E_PROVIDER')
    expect(error.message).toBe(
      'All 3 LLM providers failed: one: HTTP 500: one is down (3 attempts); two: HTTP 503: two is busy (2 attempts); three: HTTP 404: model not found (1 attempt)',
    )
    // The last failure (a 404) will not go away by itself.
    expect(error.retryable).toBe(false)
    expect((error.details.attempts as unknown[]).length).toBe(6)
  })

  it('falls back after a non-retryable error too, without retrying it', async () => {
    const providers = providersConfig('a', {a: fakeProvider(llm, 'openai'), b: fakeProvider(llm, 'anthropic')}, ['b'])
    llm.enqueue({status: 400, message: 'context too long for this model'}, {text: 'b can take it'})
    const response = await createProviderChain(providers, SECRETS, {}, QUICK).chat(userRequest('hi'))
    expect(response.provider).toBe('b')
    expect(llm.requests).toHaveLength(2)
  })

  it('uses the agent override of provider and model, and keeps the fallbacks', async () => {
    const providers = providersConfig('a', {a: fakeProvider(llm, 'openai'), b: fakeProvider(llm, 'anthropic')}, ['a'])
    const chain = createProviderChain(providers, SECRETS, {provider: 'b', model: 'claude-special'}, QUICK)
    expect(chain.order).toEqual(['b', 'a'])
    llm.enqueue({status: 400}, {text: 'from a'})
    await chain.chat(userRequest('hi'))
    expect(llm.requests[0].body.model).toBe('claude-special')
    // The override's model means nothing to the fallback, which keeps its own.
    expect(llm.requests[1].body.model).toBe('gpt-test')
  })
})

describe('configuration problems', () => {
  it('a missing API key names the variable to set, without sending anything', async () => {
    const chain = createProviderChain(
      providersConfig('main', {main: fakeProvider(llm, 'anthropic', {api_key_env: 'MY_ANTHROPIC_KEY'})}),
      {},
    )
    const error = await gatewayErrorOf(chain.chat(userRequest('hi')))
    expect(llm.requests).toHaveLength(0)
    expect(error.code).toBe('E_CONFIG')
    expect(error.message).toContain('MY_ANTHROPIC_KEY')
    expect(error.suggestions[0]).toContain('Set MY_ANTHROPIC_KEY')
  })

  it('a primary without its key falls back to a provider that has one, and the error lists both when all fail', async () => {
    const providers = providersConfig(
      'main',
      {main: fakeProvider(llm, 'anthropic', {api_key_env: 'UNSET_KEY'}), spare: fakeProvider(llm, 'openai')},
      ['spare'],
    )
    llm.enqueue({text: 'spare answers'})
    const chain = createProviderChain(providers, SECRETS, {}, QUICK)
    expect((await chain.chat(userRequest('hi'))).provider).toBe('spare')

    llm.enqueue({status: 400})
    const error = await gatewayErrorOf(chain.chat(userRequest('hi')))
    expect(error.code).toBe('E_PROVIDER')
    expect(error.message).toContain('main: no API key: the environment variable UNSET_KEY is not set')
    expect(error.message).toContain('spare: HTTP 400')
  })

  it('warm() sends nothing and changes no answer, with or without the key', async () => {
    const missing = createProviderChain(
      providersConfig('main', {main: fakeProvider(llm, 'openai', {api_key_env: 'MY_OPENAI_KEY'})}),
      {},
    )
    missing.warm()
    expect((await gatewayErrorOf(missing.chat(userRequest('hi')))).code).toBe('E_CONFIG')
    const chain = createProviderChain(providersConfig('main', {main: fakeProvider(llm, 'openai')}), SECRETS)
    chain.warm()
    await new Promise((resolve) => setTimeout(resolve, 50))
    expect(llm.requests).toHaveLength(0)
    llm.enqueue({text: 'warm answer'})
    expect((await chain.chat(userRequest('hi'))).content).toBe('warm answer')
  })

  it('a provider without api_key_env (Ollama-style) sends a placeholder key', async () => {
    const chain = createProviderChain(
      providersConfig('ollama', {ollama: fakeProvider(llm, 'openai', {api_key_env: undefined})}),
      {},
    )
    llm.enqueue({text: 'local model here'})
    expect((await chain.chat(userRequest('hi'))).content).toBe('local model here')
    expect(llm.requests[0].headers.authorization).toMatch(/^Bearer \S+/)
  })

  it('an unknown provider name is a config error at creation, listing the defined ones', () => {
    const providers = providersConfig('main', {main: fakeProvider(llm, 'openai'), other: fakeProvider(llm, 'openai')}, [
      'nope',
    ])
    expect(() => createProviderChain(providers, SECRETS)).toThrow(
      /providers\.fallback\[0\]: provider "nope" is not defined/,
    )
    expect(() =>
      createProviderChain(providersConfig('main', {main: fakeProvider(llm, 'openai')}), SECRETS, {provider: 'gone'}),
    ).toThrow(/agent provider: provider "gone" is not defined/)
  })
})
