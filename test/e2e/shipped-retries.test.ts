import fs from 'node:fs'
import path from 'node:path'
import {afterAll, beforeAll, describe, expect, it} from 'vitest'
import {presentedKey, startFakeLlm, type FakeLlm} from '../fakes/llm-server.js'
import {closedPort} from '../runtime/providers/helpers.js'
import {fakeLlmConfig, makeHome, runCli, type TestHome} from '../helpers/home.js'

/*
 * Retries, decided on the host, through what ships: `send` of the built CLI (bin/run.js over dist/)
 * serving agent-run's LLM channel, and agent-run's bundle (dist/agent-run.cjs) run by hand, which
 * calls providers itself. esbuild renames the SDKs' classes in the bundle (APIConnectionError3, in
 * dist/agent-run-providers.cjs):
 * nothing may depend on a class name.
 */

let llm: FakeLlm
const homes: TestHome[] = []
beforeAll(async () => {
  llm = await startFakeLlm()
})
afterAll(async () => {
  await llm.close()
  for (const home of homes) home.cleanup()
})

function homeFor(provider: Record<string, unknown>): TestHome {
  const config = fakeLlmConfig(llm.openaiBaseUrl, [{id: 'meepa', file_access: {unrestricted: true}}]) as {
    providers: {providers: Record<string, unknown>}
  }
  config.providers.providers.fake = provider
  const home = makeHome(config)
  homes.push(home)
  return home
}
const openai = (extra: Record<string, unknown> = {}) => ({
  kind: 'openai',
  api_key_env: 'FAKE_LLM_KEY',
  model: 'fake-model',
  base_url: llm.openaiBaseUrl,
  ...extra,
})
const anthropic = (extra: Record<string, unknown> = {}) => ({
  kind: 'anthropic',
  api_key_env: 'FAKE_LLM_KEY',
  model: 'claude-fake',
  base_url: llm.anthropicBaseUrl,
  ...extra,
})
const send = (home: TestHome, message = 'hello') =>
  runCli(['send', '--agent', 'meepa', '--json', message], {home: home.home})

describe('retries through the shipped CLI (send → runner → agent-run channel)', () => {
  it('the bundle agent-run ships has renamed SDK classes (what this suite guards against)', () => {
    // the SDKs are in the file agent-run loads in direct mode only
    expect(fs.readFileSync(path.join(import.meta.dirname, '../../dist/agent-run-providers.cjs'), 'utf8')).toMatch(
      /class APIConnectionError\d/,
    )
  })

  it.each([
    {api: 'openai', stream: false},
    {api: 'openai', stream: true},
    {api: 'anthropic', stream: false},
    {api: 'anthropic', stream: true},
  ] as const)(
    'a reset connection, 429 with Retry-After, 503, a cut-off answer and a garbage body are each retried ($api, stream: $stream)',
    async ({api, stream}) => {
      llm.reset()
      const home = homeFor((api === 'openai' ? openai : anthropic)({stream, max_retries: 5}))
      llm.enqueue(
        {disconnect: true},
        {status: 429, headers: {'retry-after': '1'}},
        {status: 503},
        {text: 'half of it', incomplete: 'truncate'},
        {text: 'x', incomplete: 'garbage'},
        {toolCalls: [{name: 'write_file', arguments: {path: 'done.txt', content: 'ok'}}]},
        {text: 'the complete answer'},
      )
      const result = await send(home)
      expect(JSON.parse(result.stdout)).toMatchObject({ok: true, reply: {content: 'the complete answer'}})
      expect(llm.requests).toHaveLength(7)
      expect(llm.requests[2]!.time - llm.requests[1]!.time).toBeGreaterThanOrEqual(950) // Retry-After: 1
    },
  )

  it.each(['openai', 'anthropic'] as const)('a 400 is not retried (%s)', async (api) => {
    llm.reset()
    const home = homeFor(api === 'openai' ? openai() : anthropic())
    llm.enqueue({status: 400, message: 'bad request body'}, {text: 'never'})
    const result = await send(home)
    expect(result.exitCode).toBe(6)
    expect(JSON.parse(result.stdout).error).toMatchObject({
      code: 'E_PROVIDER',
      message: expect.stringMatching(/HTTP 400: bad request body \(1 attempt\)/),
    })
    expect(llm.requests).toHaveLength(1)
  })

  it('a refused connection is retried, then reported with its cause and the attempts', async () => {
    const port = await closedPort()
    const home = homeFor(openai({base_url: `http://127.0.0.1:${port}/v1`}))
    const result = await send(home)
    expect(result.exitCode).toBe(6)
    const {error} = JSON.parse(result.stdout)
    expect(error).toMatchObject({code: 'E_PROVIDER', message: expect.stringMatching(/ECONNREFUSED.*\(3 attempts\)/)})
    expect(error.details.attempts).toHaveLength(3)
  })

  it('an answer slower than timeout_seconds is abandoned and retried', async () => {
    llm.reset()
    const home = homeFor(openai({stream: true, timeout_seconds: 1}))
    llm.enqueue({text: 'slow start', incomplete: 'stall', stallMs: 5_000}, {text: 'in time'})
    const result = await send(home)
    expect(JSON.parse(result.stdout)).toMatchObject({ok: true, reply: {content: 'in time'}})
    expect(llm.requests).toHaveLength(2)
  })
})

describe('retries in the bundle itself (agent-run run by hand, keys from its environment)', () => {
  const byHand = async (provider: Record<string, unknown>) => {
    const home = homeFor(provider)
    fs.mkdirSync(home.workspace('meepa'), {recursive: true})
    const input = {
      version: 1,
      run_id: 'run_by_hand',
      workspace: home.workspace('meepa'),
      secrets: {},
      agent: {
        id: 'meepa',
        max_iterations: 3,
        file_access: {},
        container_mode: {memory_limit: '512m'},
        secrets: [],
        skills: [],
      },
      providers: {primary: 'fake', fallback: [], providers: {fake: provider}},
      message: {id: 'm', connector: 'cli', channel_id: 'c', user: {id: 'u', name: 'u'}, content: 'hello'},
    }
    const result = await runCli(['agent-run'], {home: home.home, input: JSON.stringify(input)})
    return JSON.parse(result.stdout)
  }

  it('a refused connection is retried by dist/agent-run.cjs', async () => {
    const port = await closedPort()
    const output = await byHand(openai({base_url: `http://127.0.0.1:${port}/v1`}))
    expect(output.error).toMatchObject({
      code: 'E_PROVIDER',
      retryable: true,
      message: expect.stringMatching(/ECONNREFUSED.*\(3 attempts\)/),
    })
  })

  it('a reset connection and a cut-off stream are retried by dist/agent-run.cjs, with the key from its environment', async () => {
    llm.reset()
    llm.enqueue({disconnect: true}, {text: 'half', incomplete: 'truncate'}, {text: 'whole'})
    const output = await byHand(anthropic({stream: true}))
    expect(output).toMatchObject({ok: true, reply: {content: 'whole'}})
    expect(llm.requests).toHaveLength(3)
    expect(presentedKey(llm.requests[0]!)).toBe('sk-fake-test-key-123456')
  })
})
