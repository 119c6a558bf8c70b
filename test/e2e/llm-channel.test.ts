import {execa} from 'execa'
import fs from 'node:fs'
import os from 'node:os'
import path from 'node:path'
import {afterAll, beforeAll, describe, expect, it} from 'vitest'
import {startFakeLlm, type FakeLlm} from '../fakes/llm-server.js'
import {BIN} from '../helpers/home.js'
import {LLM_CHANNEL_VERSION} from '../../src/runtime/agent-run/channel.js'
import type {AgentRunInput} from '../../src/runtime/shapes/agent-run-contract.js'
import {resolveAgent} from '../../src/runtime/config/load.js'
import {runAgentProcess} from '../../src/runtime/run-lifecycle/agent-run-process.js'
import {hostLlmFor} from '../../src/runtime/llm-channel/host.js'
import {linuxLaunch} from '../../src/runtime/runners/host-sandbox.js'
import {agentEnvironment} from '../../src/runtime/run-lifecycle/private-tmp.js'
import {agentPolicy} from '../../src/runtime/host-sandbox/agent-policy.js'
import {landlockUnavailable} from '../helpers/landlock-support.js'
import type {GatewayConfig} from '../../src/runtime/config/types.js'

/*
 * The LLM channel between agent-run and its runner (docs/agent-run.md), attacked from both ends.
 * A hostile agent-run is a real process (a script in its place, as code that took agent-run over
 * would be) speaking to the real runner; a hostile runner is this test writing to the shipped
 * agent-run. Every case ends with a clear error in bounded time, never a hang.
 */

const KEY = 'sk-channel-test-key-987654'
let llm: FakeLlm
let dir: string

beforeAll(async () => {
  llm = await startFakeLlm()
  dir = fs.mkdtempSync(path.join(os.tmpdir(), 'meepa-channel-'))
})
afterAll(async () => {
  await llm.close()
  fs.rmSync(dir, {recursive: true, force: true})
})

const agent = (maxIterations = 3) => resolveAgent({id: 'hostile', max_iterations: maxIterations} as never, {})
const config = (): GatewayConfig =>
  ({
    providers: {
      primary: 'fake',
      fallback: [],
      providers: {
        fake: {kind: 'openai', model: 'configured-model', base_url: llm.openaiBaseUrl, api_key_env: 'FAKE_LLM_KEY'},
      },
    },
  }) as unknown as GatewayConfig

const input = (maxIterations = 3): AgentRunInput => ({
  version: 1,
  run_id: 'run_hostile',
  agent: agent(maxIterations),
  providers: config().providers,
  secrets: {},
  message: {id: 'm', connector: 'cli', channel_id: 'c', user: {id: 'u', name: 'u'}, content: 'hi'},
  workspace: dir,
})

const REQUEST = {system: 's', messages: [{role: 'user', content: 'hi'}], tools: []}

/** Runs `script` (Node, given the input's first line on stdin) in agent-run's place, against the real runner. */
async function hostile(
  script: string,
  options: {maxIterations?: number; timeoutMs?: number; allowNetwork?: boolean; onStderr?: (line: string) => void} = {},
) {
  const file = path.join(dir, `hostile-${Math.random().toString(36).slice(2)}.cjs`)
  fs.writeFileSync(
    file,
    `
const rl = require('readline').createInterface({input: process.stdin})
const lines = [], waiters = []
const next = () => new Promise((resolve) => lines.length ? resolve(lines.shift()) : waiters.push(resolve))
rl.on('line', (line) => waiters.length ? waiters.shift()(line) : lines.push(line))
const send = (frame) => process.stdout.write(typeof frame === 'string' ? frame : JSON.stringify(frame) + '\\n')
const REQUEST = ${JSON.stringify(REQUEST)}
;(async () => { const input = JSON.parse(await next()); ${script} })()
`,
  )
  let launch: {argv: string[]; env: Record<string, string>; fd3?: string} = {
    argv: [process.execPath, file],
    env: {PATH: process.env.PATH ?? '/usr/bin:/bin'},
  }
  if (options.allowNetwork !== undefined) {
    // exactly how the host-sandbox runner starts agent-run, with this script in its place
    const tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'meepa-channel-tmp-'))
    const sandboxed = resolveAgent(
      {
        id: 'hostile',
        file_access: {allow_network: options.allowNetwork, allow_listen: options.allowNetwork, allow_read: [dir]},
      } as never,
      {},
    )
    const policy = agentPolicy({
      agent: sandboxed,
      config: {...config(), agents: [sandboxed]} as GatewayConfig,
      home: path.join(dir, 'home'),
      workspace: dir,
      tmpDir: tmp,
    })
    const linux = await linuxLaunch(policy, agentEnvironment(dir, tmp), {command: [process.execPath, file]})
    if ('error' in linux) throw new Error(linux.error)
    launch = linux
  }
  const started = Date.now()
  const output = await runAgentProcess({
    ...launch,
    cwd: dir,
    input: input(options.maxIterations),
    llm: hostLlmFor(agent(options.maxIterations), config(), {FAKE_LLM_KEY: KEY}),
    timeoutMs: options.timeoutMs ?? 20_000,
    onStderr: options.onStderr,
  })
  return {output, ms: Date.now() - started}
}

describe('a hostile agent-run against the real runner', () => {
  it('gets its input with llm_channel and no key, and a well-formed request is answered by the configured provider only', async () => {
    llm.reset()
    llm.enqueue({text: 'hello from the host'})
    const {output} = await hostile(`
      if (JSON.stringify(input).includes(${JSON.stringify(KEY)})) throw new Error('key in input')
      send({type: 'llm_request', id: 1, request: {...REQUEST, model: 'gpt-expensive', provider: 'other', base_url: 'http://127.0.0.1:1/v1', api_key_env: 'HOME'}, provider: 'other'})
      const answer = JSON.parse(await next())
      send({type: 'result', output: {version: 1, ok: true, run_id: input.run_id, reply: {content: answer.response.content + ' / channel ' + input.llm_channel}, stop_reason: 'final', iterations: 1, tool_calls: [], usage: {input_tokens: 0, output_tokens: 0}, ms: 1}})
    `)
    expect(output, JSON.stringify(output)).toMatchObject({
      ok: true,
      reply: {content: `hello from the host / channel ${LLM_CHANNEL_VERSION}`},
    })
    expect(llm.requests).toHaveLength(1)
    // the frame's model, provider and base_url were ignored
    expect(llm.requests[0]?.body.model).toBe('configured-model')
    expect(llm.requests[0]?.headers.authorization).toBe(`Bearer ${KEY}`)
  })

  it.each([
    ['a line that is not JSON', `send('{"type": "llm_request", oops\\n')`, /not JSON/],
    [
      'a frame of an unknown type (asking for the config)',
      `send({type: 'read_config', path: '/etc/passwd'})`,
      /unknown type "read_config"/,
    ],
    [
      "another agent's data",
      `send({type: 'memory_search', agent: 'other', query: 'x'})`,
      /unknown type "memory_search"/,
    ],
    [
      'a request with a role the loop never sends',
      `send({type: 'llm_request', id: 1, request: {...REQUEST, messages: [{role: 'system', content: 'x'}]}})`,
      /messages\[0\] has an unknown role "system"/,
    ],
    [
      'a request without messages',
      `send({type: 'llm_request', id: 1, request: {system: 's', messages: [], tools: []}})`,
      /messages are not a non-empty array/,
    ],
    [
      'a request whose id is not a positive integer',
      `send({type: 'llm_request', id: 'x', request: REQUEST})`,
      /id is not a positive integer/,
    ],
    [
      'a second request while the first is unanswered',
      `send({type: 'llm_request', id: 1, request: REQUEST}); send({type: 'llm_request', id: 2, request: REQUEST}); await new Promise(() => {})`,
      /second llm_request while one was still unanswered/,
    ],
    [
      'a result whose output is not the contract',
      `send({type: 'result', output: {ok: 'yes'}})`,
      /result frame without a valid output/,
    ],
    [
      'a success result without a reply (the gateway would read reply.content)',
      `send({type: 'result', output: {version: 1, ok: true, run_id: input.run_id}})`,
      /result frame without a valid output/,
    ],
    [
      'a success result whose usage is not numbers',
      `send({type: 'result', output: {version: 1, ok: true, run_id: input.run_id, reply: {content: 'x'}, stop_reason: 'final', iterations: 0, tool_calls: [], usage: null, ms: 1}})`,
      /result frame without a valid output/,
    ],
    [
      'a success result whose files are not paths (the gateway would open file.path)',
      `send({type: 'result', output: {version: 1, ok: true, run_id: input.run_id, reply: {content: 'x'}, stop_reason: 'final', iterations: 0, tool_calls: [], usage: {input_tokens: 0, output_tokens: 0}, ms: 1, files: [{path: 7}]}})`,
      /files\[0\] is not \{path\}/,
    ],
    [
      'a success result naming more files than any message could carry',
      `send({type: 'result', output: {version: 1, ok: true, run_id: input.run_id, reply: {content: 'x'}, stop_reason: 'final', iterations: 0, tool_calls: [], usage: {input_tokens: 0, output_tokens: 0}, ms: 1, files: Array.from({length: 1001}, () => ({path: 'a'}))}})`,
      /files is not an array of at most 1000/,
    ],
    [
      'a failure result without an error',
      `send({type: 'result', output: {version: 1, ok: false, run_id: input.run_id}})`,
      /result frame without a valid output/,
    ],
    [
      'a failure result with an error code the gateway does not know',
      `send({type: 'result', output: {version: 1, ok: false, run_id: input.run_id, error: {code: {}, message: 7, retryable: false}}})`,
      /result frame without a valid output/,
    ],
  ])('%s: E_RUN naming it, the run stopped at once', async (_name, script, message) => {
    llm.reset()
    llm.setDefault({text: 'answer', delayMs: 300})
    const {output, ms} = await hostile(`${script}; await new Promise(() => {})`)
    expect(output).toMatchObject({ok: false, error: {code: 'E_RUN', message: expect.stringMatching(message)}})
    expect(output.ok === false && output.error.message).toMatch(/broke the LLM channel protocol/)
    expect(ms).toBeLessThan(5_000)
  })

  it('a line of more than 8 MiB without a newline is refused before it is buffered whole', async () => {
    const {output, ms} = await hostile(
      `const mb = 'x'.repeat(1024 * 1024); for (let i = 0; i < 12; i++) send(mb); await new Promise(() => {})`,
    )
    expect(output).toMatchObject({
      ok: false,
      error: {code: 'E_RUN', message: expect.stringMatching(/line longer than 8388608 bytes/)},
    })
    expect(ms).toBeLessThan(5_000)
  })

  it("more requests than the agent's max_iterations: the extra one reaches no provider", async () => {
    llm.reset()
    llm.setDefault({text: 'answer'})
    const {output} = await hostile(
      `for (let id = 1; id <= 5; id++) { send({type: 'llm_request', id, request: REQUEST}); await next() } await new Promise(() => {})`,
      {maxIterations: 2},
    )
    expect(output).toMatchObject({
      ok: false,
      error: {code: 'E_RUN', message: expect.stringMatching(/more llm_requests than the agent's max_iterations \(2\)/)},
    })
    expect(llm.requests).toHaveLength(2)
  })

  it('a result written just before exiting is never lost (20 runs)', async () => {
    for (let i = 0; i < 20; i++) {
      const {output} = await hostile(
        `process.stdout.write(JSON.stringify({type: 'result', output: {version: 1, ok: true, run_id: input.run_id, reply: {content: 'x'.repeat(200000)}, stop_reason: 'final', iterations: 0, tool_calls: [], usage: {input_tokens: 0, output_tokens: 0}, ms: 1}}) + '\\n', () => process.exit(0))`,
      )
      expect(output.ok, JSON.stringify(output).slice(0, 300)).toBe(true)
    }
  })

  it('exits without a result: E_RUN, not a hang', async () => {
    const {output, ms} = await hostile(`send({type: 'llm_request', id: 1, request: REQUEST}); process.exit(0)`)
    expect(output).toMatchObject({
      ok: false,
      error: {code: 'E_RUN', message: expect.stringMatching(/exited with code 0 without a result/)},
    })
    expect(ms).toBeLessThan(5_000)
  })

  it.each([
    ['an error message', {status: 401, message: `Incorrect API key provided: ${KEY}`}],
    ['an answer', {text: `the proxy saw Authorization: Bearer ${KEY}`}],
  ])('a provider (or proxy) that echoes the key in %s: agent-run never receives the key', async (_name, turn) => {
    llm.reset()
    // every request gets it: one an earlier test's run left in flight may still come, and took a queued turn in CI
    llm.setDefault(turn as never)
    const {output} = await hostile(`
      send({type: 'llm_request', id: 1, request: REQUEST}); const line = await next()
      send({type: 'result', output: {version: 1, ok: true, run_id: input.run_id, reply: {content: line.includes(${JSON.stringify(KEY)}) ? 'LEAKED ' + line : 'CLEAN ' + line}, stop_reason: 'final', iterations: 0, tool_calls: [], usage: {input_tokens: 0, output_tokens: 0}, ms: 1}})
      process.exit(0)`)
    expect(output, JSON.stringify(output)).toMatchObject({
      ok: true,
      reply: {content: expect.stringMatching(/^CLEAN .*\[REDACTED\]/)},
    })
  })

  it("a flood of stderr (64 MiB of lines) does not flood the gateway's log", async () => {
    const logged: string[] = []
    const {output} = await hostile(
      `
      const chunk = ('x'.repeat(99) + '\\n').repeat(10_000)
      for (let i = 0; i < 64; i++) await new Promise((resolve) => process.stderr.write(chunk, resolve))
      send({type: 'result', output: {version: 1, ok: true, run_id: input.run_id, reply: {content: 'done'}, stop_reason: 'final', iterations: 0, tool_calls: [], usage: {input_tokens: 0, output_tokens: 0}, ms: 1}})
      process.exit(0)`,
      {onStderr: (line) => logged.push(line)},
    )
    expect(output).toMatchObject({ok: true})
    expect(logged.join('\n').length).toBeLessThan(1024 * 1024)
    expect(logged.at(-1)).toMatch(/more than .* on stderr; the rest is not logged/)
  })

  it('reports the tokens the runner really spent, not what agent-run claims (it says 0 after two calls)', async () => {
    llm.reset()
    llm.setDefault({text: 'answer'})
    const {output} = await hostile(`
      for (let id = 1; id <= 2; id++) { send({type: 'llm_request', id, request: REQUEST}); await next() }
      send({type: 'result', output: {version: 1, ok: true, run_id: input.run_id, reply: {content: 'x'}, stop_reason: 'final', iterations: 2, tool_calls: [], usage: {input_tokens: 0, output_tokens: 0}, ms: 1}})
      process.exit(0)`)
    expect(output.ok && output.usage.input_tokens, JSON.stringify(output)).toBeGreaterThan(0)
    expect(output.ok && output.usage.output_tokens).toBeGreaterThan(0)
  })

  it('says nothing at all: the run deadline ends it', async () => {
    const {output} = await hostile(`await new Promise(() => {})`, {timeoutMs: 1500})
    expect(output).toMatchObject({ok: false, error: {code: 'E_TIMEOUT'}})
  })
})

describe.skipIf(landlockUnavailable() !== undefined)('agent-run itself under the host sandbox', () => {
  // What a taken-over agent-run would try: reach the LLM (or anything) itself. The TCP connect goes
  // to the fake LLM on 127.0.0.1.
  const PROBE = `
    const net = require('net'), dgram = require('dgram')
    const tcp = await new Promise((resolve) => { try { const s = net.connect(${'${'}PORT}, '127.0.0.1'); s.on('connect', () => { s.destroy(); resolve('CONNECTED') }); s.on('error', (e) => resolve('tcp ' + e.code)) } catch (e) { resolve('tcp ' + e.code) } })
    let udp; try { const u = dgram.createSocket('udp4'); await new Promise((resolve, reject) => { u.once('error', reject); u.send(Buffer.from('x'), ${'${'}PORT}, '127.0.0.1', (e) => (e ? reject(e) : resolve())) }); udp = 'UDP SENT'; u.close() } catch (e) { udp = 'udp ' + e.code }
    send({type: 'result', output: {version: 1, ok: true, run_id: input.run_id, reply: {content: tcp + ' / ' + udp}, stop_reason: 'final', iterations: 0, tool_calls: [], usage: {input_tokens: 0, output_tokens: 0}, ms: 1}})
    process.exit(0)`

  it('with allow_network: false it has no network at all (TCP to the LLM, UDP), and its LLM calls still work through the channel', async () => {
    llm.reset()
    llm.enqueue({text: 'via the runner'})
    const {output} = await hostile(
      `
      send({type: 'llm_request', id: 1, request: REQUEST}); const answer = JSON.parse(await next()).response.content
      ${PROBE.replaceAll('${PORT}', String(llm.port)).replace("reply: {content: tcp + ' / ' + udp}", "reply: {content: answer + ' / ' + tcp + ' / ' + udp}")}`,
      {allowNetwork: false},
    )
    expect(output, JSON.stringify(output)).toMatchObject({
      ok: true,
      reply: {content: expect.stringMatching(/^via the runner \/ tcp E(PERM|ACCES) /)},
    })
    expect(output.ok && output.reply.content).toMatch(/udp E(PERM|ACCES)$/)
    expect(llm.requests).toHaveLength(1) // the runner's call, nothing from inside
  })

  it("control: with allow_network (and allow_listen, which Node's UDP sockets need) the same program connects", async () => {
    const {output} = await hostile(PROBE.replaceAll('${PORT}', String(llm.port)), {allowNetwork: true})
    expect(output, JSON.stringify(output)).toMatchObject({ok: true, reply: {content: 'CONNECTED / UDP SENT'}})
  })
})

describe('a hostile runner against the shipped agent-run', () => {
  const agentRun = (stdin: string, timeout = 20_000) =>
    execa(process.execPath, [BIN, 'agent-run'], {
      input: stdin,
      reject: false,
      timeout,
      env: {PATH: process.env.PATH ?? ''},
      extendEnv: false,
    })
  const channelInput = () => JSON.stringify({...input(), llm_channel: LLM_CHANNEL_VERSION})
  const lastFrame = (stdout: string) => JSON.parse(stdout.trim().split('\n').at(-1)!)

  it('asks for its LLM call on stdout, and ends with E_RUN when stdin closes instead of an answer', async () => {
    const result = await agentRun(`${channelInput()}\n`)
    const frames = result.stdout
      .trim()
      .split('\n')
      .map((line) => JSON.parse(line))
    expect(frames[0]).toMatchObject({
      type: 'llm_request',
      id: 1,
      request: {system: expect.any(String), messages: [{role: 'user', content: 'hi'}]},
    })
    expect(frames.at(-1)).toMatchObject({
      type: 'result',
      output: {ok: false, error: {code: 'E_RUN', message: expect.stringMatching(/runner closed stdin/)}},
    })
    expect(result.exitCode).toBe(1)
  })

  it.each([
    ['a line that is not JSON', 'garbage\n', /not JSON/],
    [
      'an answer to a request it never made',
      `${JSON.stringify({type: 'llm_response', id: 7, ok: true, response: {content: 'x', tool_calls: [], usage: {}}})}\n`,
      /request 7, which is not waiting/,
    ],
    [
      'an answer without a response',
      `${JSON.stringify({type: 'llm_response', id: 1, ok: true})}\n`,
      /without a valid response/,
    ],
  ])('answers %s from the runner with E_INPUT', async (_name, frame, message) => {
    const result = await agentRun(`${channelInput()}\n${frame}`)
    expect(lastFrame(result.stdout)).toMatchObject({
      type: 'result',
      output: {ok: false, error: {code: 'E_INPUT', message: expect.stringMatching(message)}},
    })
    expect(result.exitCode).toBe(2)
  })

  it('refuses a channel version it does not speak', async () => {
    const result = await agentRun(`${JSON.stringify({...input(), llm_channel: 99})}\n`)
    expect(JSON.parse(result.stdout)).toMatchObject({
      ok: false,
      error: {code: 'E_INPUT', message: expect.stringMatching(/llm_channel 99 is not supported/)},
    })
  })

  // direct mode loads the providers from a bundle of their own (dist/agent-run-providers.cjs)
  it('run by hand (no llm_channel) it calls the provider itself, with the key of its environment', async () => {
    llm.reset()
    llm.requireApiKey(KEY)
    llm.setDefault({text: 'direct answer'})
    const result = await execa(process.execPath, [BIN, 'agent-run'], {
      input: JSON.stringify(input()),
      reject: false,
      timeout: 20_000,
      env: {PATH: process.env.PATH ?? '', FAKE_LLM_KEY: KEY},
      extendEnv: false,
    })
    llm.reset()
    expect(JSON.parse(result.stdout), result.stderr).toMatchObject({ok: true, reply: {content: 'direct answer'}})
    expect(result.stderr).not.toMatch(/ExperimentalWarning/)
  })
})
