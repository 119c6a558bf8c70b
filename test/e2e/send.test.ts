import fs from 'node:fs'
import path from 'node:path'
import {afterAll, afterEach, beforeAll, beforeEach, describe, expect, it} from 'vitest'
import {startFakeLlm, type FakeLlm} from '../fakes/llm-server.js'
import {fakeLlmConfig, makeHome, runCli, type TestHome} from '../helpers/home.js'

// The real path a user takes: the built CLI, `send` -> runner -> `agent-run` child -> official SDK -> fake LLM.
describe('send (unrestricted level) end to end', () => {
  let llm: FakeLlm
  let home: TestHome
  beforeAll(async () => {
    llm = await startFakeLlm()
  })
  afterAll(() => llm.close())
  beforeEach(() => {
    llm.reset()
    home = makeHome(fakeLlmConfig(llm.openaiBaseUrl, [{id: 'meepa', file_access: {unrestricted: true}}]))
  })
  afterEach(() => home.cleanup())

  const send = (message: string, ...flags: string[]) =>
    runCli(['send', '--agent', 'meepa', ...flags, message], {home: home.home})

  it('runs a tool call that writes a file in the workspace and prints the final reply', async () => {
    llm.enqueue(
      {toolCalls: [{name: 'write_file', arguments: {path: 'hello.txt', content: 'written by the agent'}}]},
      {text: 'Done: hello.txt is written.'},
    )
    const result = await send('write hello.txt')
    expect(result.stderr).not.toContain('Error')
    expect(result.exitCode).toBe(0)
    expect(result.stdout.trim()).toBe('Done: hello.txt is written.')
    expect(fs.readFileSync(path.join(home.workspace('meepa'), 'hello.txt'), 'utf8')).toBe('written by the agent')
    const toolResult = llm.requests[1]?.body.messages.at(-1)
    expect(toolResult).toMatchObject({role: 'tool', content: expect.stringContaining('wrote 20 bytes')})
    expect(llm.requests[0]?.headers.authorization).toBe('Bearer sk-fake-test-key-123456')
  })

  it('remembers with memory_store in one message and finds it with memory_search in the next', async () => {
    llm.enqueue(
      {toolCalls: [{name: 'memory_store', arguments: {content: 'The staging database lives on port 5433'}}]},
      {text: 'Noted.'},
    )
    expect((await send('remember: staging db is on 5433')).exitCode).toBe(0)
    llm.enqueue({toolCalls: [{name: 'memory_search', arguments: {query: 'staging database port'}}]}, (request) => {
      const found = request.body.messages.at(-1).content as string
      return {text: `From memory: ${found}`}
    })
    const second = await send('which port is staging on?')
    expect(second.stdout).toContain('From memory: [1] The staging database lives on port 5433')
    // the second message also carries the first conversation as channel history
    expect(JSON.stringify(llm.requests[2]?.body.messages)).toContain('remember: staging db is on 5433')
  })

  it('falls back to the next provider after the primary answers 500 three times', async () => {
    const backup = await startFakeLlm()
    try {
      const config = fakeLlmConfig(llm.openaiBaseUrl, [{id: 'meepa', file_access: {unrestricted: true}}]) as {
        providers: any
      }
      config.providers.fallback = ['backup']
      config.providers.providers.backup = {
        kind: 'anthropic',
        api_key_env: 'FAKE_LLM_KEY',
        model: 'claude-fake',
        base_url: backup.anthropicBaseUrl,
      }
      home.writeConfig(config)
      llm.enqueue({status: 500}, {status: 500}, {status: 500})
      backup.enqueue({text: 'answered by the fallback'})
      const result = await send('hello')
      expect(result.stdout.trim()).toBe('answered by the fallback')
      expect(llm.requests).toHaveLength(3)
      expect(backup.requests).toHaveLength(1)
      expect(backup.requests[0]?.api).toBe('anthropic')
    } finally {
      await backup.close()
    }
  })

  it('does not retry a 400 and exits with an E_PROVIDER error naming the provider', async () => {
    llm.enqueue({status: 400, message: 'context too long'})
    const result = await send('hello', '--json')
    expect(result.exitCode).toBe(6)
    expect(llm.requests).toHaveLength(1)
    const {error} = JSON.parse(result.stdout)
    expect(error.code).toBe('E_PROVIDER')
    expect(error.message).toContain('fake')
    expect(error.message).toContain('400')
    expect(error.suggestions.length).toBeGreaterThan(0) // the provider's advice survives agent-run and the runner
  })

  it('stops at max_iterations with a reply that says so', async () => {
    const config = fakeLlmConfig(llm.openaiBaseUrl, [
      {id: 'meepa', max_iterations: 2, file_access: {unrestricted: true}},
    ])
    home.writeConfig(config)
    llm.setDefault({toolCalls: [{name: 'list_files', arguments: {}}]})
    const result = await send('loop forever', '--json')
    const output = JSON.parse(result.stdout)
    expect(output).toMatchObject({ok: true, stop_reason: 'max_iterations', iterations: 2})
    expect(output.reply.content).toContain('max_iterations: 2')
    expect(output.tool_calls).toHaveLength(2)
    expect(llm.requests).toHaveLength(2)
  })

  it('keeps provider keys out of the environment of shell commands and out of the reply', async () => {
    llm.enqueue(
      {toolCalls: [{name: 'shell', arguments: {command: 'env; cat /proc/self/environ | tr "\\0" "\\n"'}}]},
      (request) => ({
        text: `env was: ${request.body.messages.at(-1).content}`,
      }),
    )
    const result = await send('print your env', '--json')
    const output = JSON.parse(result.stdout)
    expect(output.ok).toBe(true)
    expect(output.reply.content).toContain('HOME=')
    expect(output.reply.content).not.toContain('sk-fake-test-key-123456')
    expect(output.reply.content).not.toContain('FAKE_LLM_KEY')
    expect(output.reply.content).not.toContain('[REDACTED]') // absent, not merely masked
  })

  it('with no isolation a command can find the key in the gateway process; it is masked before the provider and in the reply', async () => {
    // unrestricted gives no isolation: the operator's processes (send here) are readable by the agent's commands
    // up from the shell: agent-run, its keeper, then `send`, which holds the key to make the LLM calls
    const command = `p=$PPID; while [ "$p" -gt 1 ]; do tr "\\0" "\\n" < /proc/$p/environ 2>/dev/null | grep '^FAKE_LLM_KEY=' && break; p=$(awk '{print $4}' /proc/$p/stat); done`
    llm.enqueue({toolCalls: [{name: 'shell', arguments: {command}}]}, (request) => ({
      text: `found: ${request.body.messages.at(-1).content}`,
    }))
    const result = await send('find a key', '--json')
    const output = JSON.parse(result.stdout)
    expect(output.reply.content, result.stdout).toContain('FAKE_LLM_KEY=[REDACTED]')
    expect(JSON.stringify(llm.requests[1]?.body.messages)).toContain('FAKE_LLM_KEY=[REDACTED]')
    expect(JSON.stringify(llm.requests[1]?.body.messages)).not.toContain('sk-fake-test-key-123456')
    expect(result.stdout).not.toContain('sk-fake-test-key-123456')
  })

  const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms))
  const survivors = (marker: string) =>
    fs.readdirSync('/proc').filter((pid) => {
      try {
        return /^\d+$/.test(pid) && fs.readFileSync(`/proc/${pid}/cmdline`, 'utf8').includes(marker)
      } catch {
        return false
      }
    })

  it("kills a shell command and what it started in the background at the tool's timeout", async () => {
    const sentinel = path.join(home.workspace('meepa'), 'late-tool')
    llm.enqueue(
      {
        toolCalls: [
          {name: 'shell', arguments: {command: `(sleep 2; touch ${sentinel}) & sleep 30`, timeout_seconds: 1}},
        ],
      },
      (request) => ({
        text: request.body.messages.at(-1).content,
      }),
    )
    const started = Date.now()
    const result = await send('run it')
    expect(result.stdout).toContain('command timed out after 1 s')
    expect(Date.now() - started).toBeLessThan(10_000)
    await sleep(2500)
    expect(fs.existsSync(sentinel)).toBe(false)
  })

  it('kills the whole run at the agent timeout: an E_TIMEOUT reply and no late side effect', async () => {
    home.writeConfig(
      fakeLlmConfig(llm.openaiBaseUrl, [{id: 'meepa', timeout_seconds: 2, file_access: {unrestricted: true}}]),
    )
    const sentinel = path.join(home.workspace('meepa'), 'late-run')
    llm.enqueue({toolCalls: [{name: 'shell', arguments: {command: `(sleep 3; touch ${sentinel}) & sleep 31`}}]})
    const result = await send('run it', '--json')
    expect(result.exitCode).toBe(7)
    expect(JSON.parse(result.stdout).error).toMatchObject({
      code: 'E_TIMEOUT',
      message: expect.stringContaining('longer than 2 s'),
    })
    await sleep(3500)
    expect(fs.existsSync(sentinel)).toBe(false)
    expect(survivors('sleep 31')).toEqual([])
  })

  it('reads the message from stdin with "-" and refuses an empty one', async () => {
    llm.enqueue({text: 'got it'})
    const piped = await runCli(['send', '--agent', 'meepa', '-'], {home: home.home, input: 'from stdin'})
    expect(piped.stdout.trim()).toBe('got it')
    expect(llm.requests[0]?.body.messages.at(-1)).toEqual({role: 'user', content: 'from stdin'})
    const empty = await runCli(['send', '--agent', 'meepa', '-'], {home: home.home, input: '  '})
    expect(empty.exitCode).toBe(2)
    expect(empty.stderr).toContain('the message is empty')
  })

  it('names the unknown agent and the known ones', async () => {
    const result = await runCli(['send', '--agent', 'nobody', 'hi'], {home: home.home})
    expect(result.exitCode).toBe(4)
    expect(result.stderr).toContain('unknown agent "nobody"')
    expect(result.stderr).toContain('known agents: meepa')
  })
})

describe('agent-run stdin contract', () => {
  const agentRun = (input: string) => runCli(['agent-run'], {home: '/nonexistent', input})

  it.each([
    ['empty stdin', '', /no input on stdin/],
    ['not JSON', '{"version": 1,', /not valid JSON/],
    ['an array', '[1]', /one JSON object/],
    [
      'missing fields',
      '{"version": 1, "run_id": "r1"}',
      /workspace: must be an absolute path.*agent: must be an object/,
    ],
    ['wrong version', '{"version": 2}', /version: must be 1/],
  ])('answers %s with E_INPUT on stdout, a non-zero exit and no stack trace', async (_name, input, message) => {
    const result = await agentRun(input)
    expect(result.exitCode).toBe(2)
    const output = JSON.parse(result.stdout)
    expect(output).toMatchObject({
      version: 1,
      ok: false,
      error: {code: 'E_INPUT', message: expect.stringMatching(message)},
    })
    expect(result.stdout.split('\n').filter(Boolean)).toHaveLength(1)
    expect(result.stdout + result.stderr).not.toMatch(/\n\s+at /)
  })
})
