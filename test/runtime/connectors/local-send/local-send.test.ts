import Database from 'better-sqlite3'
import {execa, type ResultPromise} from 'execa'
import fs from 'node:fs'
import net from 'node:net'
import path from 'node:path'
import {afterEach, describe, expect, it} from 'vitest'
import {localSendDir, localSendSocket, localSendToken} from '../../../../src/runtime/connectors/local-send/protocol.js'
import {loadConfig} from '../../../../src/runtime/config/load.js'
import {startGateway} from '../../../../src/runtime/gateway/gateway.js'
import type {FakeLlm} from '../../../fakes/llm-server.js'
import {fakeLlmForTests} from '../../../helpers/fake-llm-for-tests.js'
import {BIN, fakeLlmConfig, makeHome, ROOT as ROOT_DIR, runCli, type TestHome} from '../../../helpers/home.js'
import {agentRunsIn, processesWith, uniqueMarker} from '../../../helpers/processes.js'
import {startServeProcess, type ServeProcess} from '../../../helpers/serve-process.js'
import {requireLandlockOrSkip} from '../../../helpers/landlock-support.js'
import {waitFor} from '../../../helpers/wait-for.js'

// `send` with a gateway of the same home serving: the message runs there (its queue, its run
// record, an agent-run started before the message), with exactly what a one-shot `send` would
// run; anything else runs one-shot. All through the shipped CLI (bin/run.js over dist/).

let llm: FakeLlm
let home: TestHome | undefined
const serves: ResultPromise[] = []

fakeLlmForTests((started) => (llm = started), {resetBeforeEach: true})
afterEach(async () => {
  for (const serve of serves.splice(0)) {
    serve.kill('SIGKILL')
    await serve.catch(() => {})
  }
  home?.cleanup()
  home = undefined
})

/** runCli's environment: what a gateway needs for `send` to find it the same. */
const SEND_ENV = {MEEPA_RETRY_BASE_MS: '20'}

async function startServe(env: Record<string, string> = SEND_ENV, args: string[] = []): Promise<ServeProcess> {
  const serve = await startServeProcess({home: home!.home, configPath: home!.configPath, env, args})
  serves.push(serve.process)
  // the socket is up once its token is written
  const deadline = Date.now() + 10_000
  while (!fs.existsSync(localSendToken(home!.home))) {
    if (Date.now() > deadline) throw new Error(`serve wrote no token for send:\n${serve.output()}`)
    await new Promise((resolve) => setTimeout(resolve, 20))
  }
  return serve
}

const send = (
  agent: string,
  message: string,
  options: {env?: Record<string, string>; flags?: string[]; input?: string} = {},
) =>
  runCli(['send', '--agent', agent, ...(options.flags ?? []), message], {
    home: home!.home,
    env: options.env,
    input: options.input,
  })

/** `send` as a child the test can signal. */
const sendProcess = (agent: string, message: string) =>
  execa(process.execPath, [BIN, 'send', '--agent', agent, message], {
    env: {MEEPAGATEWAY_HOME: home!.home, FAKE_LLM_KEY: 'sk-fake-test-key-123456', ...SEND_ENV},
    reject: false,
  })

/** The runs the gateway recorded (a one-shot `send` records none there). */
function recordedRuns(): Array<{id: string; connector: string; status: string; agent_id: string}> {
  const db = new Database(path.join(home!.home, 'gateway.db'), {readonly: true})
  try {
    return db.prepare('SELECT id, connector, status, agent_id FROM runs ORDER BY started_at').all() as Array<{
      id: string
      connector: string
      status: string
      agent_id: string
    }>
  } finally {
    db.close()
  }
}

const shell = (command: string) => ({toolCalls: [{name: 'shell', arguments: {command}}]})
const lastToolResult = (request: {body: any}) => String(request.body.messages.at(-1).content)

describe('send through a running gateway', {timeout: 90_000}, () => {
  it('runs the message in the gateway, in an agent-run started before the message arrived, and prints what a one-shot send prints', async () => {
    home = makeHome(fakeLlmConfig(llm.openaiBaseUrl, [{id: 'free', file_access: {unrestricted: true}}]))
    const workspace = home.workspace('free')
    // one-shot first (no gateway): the reference
    llm.enqueue({text: 'the same reply'})
    const alone = await send('free', 'hello', {flags: ['--json', '--channel', 'one']})
    expect(alone.exitCode, alone.stderr).toBe(0)
    expect(fs.existsSync(path.join(home.home, 'gateway.db')) ? recordedRuns() : []).toEqual([])

    const serve = await startServe()
    llm.enqueue({text: 'the same reply'})
    const first = await send('free', 'hello', {flags: ['--json', '--channel', 'two']})
    expect(first.exitCode, first.stderr).toBe(0)
    const [a, b] = [JSON.parse(alone.stdout), JSON.parse(first.stdout)]
    expect({...b, run_id: 'x', ms: 0}).toEqual({...a, run_id: 'x', ms: 0})
    expect(recordedRuns()).toEqual([
      expect.objectContaining({id: b.run_id, connector: 'cli', status: 'ok', agent_id: 'free'}),
    ])
    expect(serve.output()).toContain(`run ${b.run_id}: agent free via cli ok`)

    // the next message's agent-run is already running, and it is the one that serves that message
    const [standby] = await waitFor('a standby agent-run', () => {
      const pids = agentRunsIn(workspace)
      return pids.length === 1 && pids
    })
    llm.enqueue(shell('echo "parent=$PPID"'), (request) => ({text: lastToolResult(request)}))
    const second = await send('free', 'who runs you?')
    expect(second.exitCode, second.stderr).toBe(0)
    expect(second.stdout).toContain(`parent=${standby}`)
    expect(recordedRuns()).toHaveLength(2)
    // and it is gone with its run; a new one waits
    await waitFor('the next standby', () => {
      const pids = agentRunsIn(workspace)
      return pids.length === 1 && pids[0] !== standby
    })
    expect(fs.existsSync(`/proc/${standby}`)).toBe(false)
  })

  it('runs the message itself, as before, when the gateway would run something else: another environment, another config, --unrestricted, an unknown agent', async () => {
    home = makeHome(fakeLlmConfig(llm.openaiBaseUrl, [{id: 'free', file_access: {unrestricted: true}}, {id: 'boxed'}]))
    await startServe()
    llm.setDefault({text: 'ok'})
    // another value of the provider key: the one-shot run uses send's (the fake LLM sees it)
    const otherKey = await send('free', 'hi', {env: {FAKE_LLM_KEY: 'sk-other-key-of-this-shell'}})
    expect(otherKey.exitCode, otherKey.stderr).toBe(0)
    expect(llm.requests.at(-1)?.headers.authorization).toBe('Bearer sk-other-key-of-this-shell')
    // a variable that shapes runs (the agent's PATH)
    expect((await send('free', 'hi', {env: {PATH: `/opt/elsewhere:${process.env.PATH}`}})).exitCode).toBe(0)
    // --unrestricted for this invocation only
    expect((await send('boxed', 'hi', {flags: ['--unrestricted']})).exitCode).toBe(0)
    expect(recordedRuns()).toEqual([])
    // an unknown agent: the one-shot error, word for word
    const unknown = await send('nobody', 'hi')
    expect(unknown.exitCode).toBe(4)
    expect(unknown.stderr).toMatch(/unknown agent "nobody"/)
    // another config file (a copy of the gateway's, byte for byte): runs one-shot
    const copy = path.join(home.home, 'copy.yaml')
    fs.copyFileSync(home.configPath, copy)
    expect((await send('free', 'hi', {flags: ['--config', copy]})).exitCode).toBe(0)
    expect(recordedRuns()).toEqual([])
    // the same environment and config: the gateway runs it
    expect((await send('free', 'hi')).exitCode).toBe(0)
    expect(recordedRuns()).toHaveLength(1)
    // the file edited by hand since the gateway started: the gateway catches up with it (config-watch.test.ts) and runs it
    home.writeConfig(
      fakeLlmConfig(llm.openaiBaseUrl, [
        {id: 'free', file_access: {unrestricted: true}, max_iterations: 3},
        {id: 'boxed'},
      ]),
    )
    expect((await send('free', 'hi')).exitCode).toBe(0)
    expect(recordedRuns()).toHaveLength(2)
  })

  it('a failed run fails the same way: the error, its code and the exit status', async () => {
    home = makeHome(fakeLlmConfig(llm.openaiBaseUrl, [{id: 'free', file_access: {unrestricted: true}}]))
    llm.setDefault({status: 401, message: 'invalid api key'})
    const alone = await send('free', 'hi', {flags: ['--json']})
    await startServe()
    const through = await send('free', 'hi', {flags: ['--json']})
    expect(recordedRuns()).toEqual([expect.objectContaining({status: 'failed'})])
    expect(through.exitCode).toBe(alone.exitCode)
    expect(alone.exitCode).toBe(6)
    const [a, b] = [JSON.parse(alone.stdout).error, JSON.parse(through.stdout).error]
    expect({...b, details: {...b.details, run_id: 'x'}}).toEqual({...a, details: {...a.details, run_id: 'x'}})
  })

  it('Ctrl-C on send stops the gateway run with everything it started and exits 130; a killed send stops it too', async () => {
    home = makeHome(fakeLlmConfig(llm.openaiBaseUrl, [{id: 'free', file_access: {unrestricted: true}}]))
    const serve = await startServe()
    for (const signal of ['SIGINT', 'SIGKILL'] as const) {
      const marker = uniqueMarker()
      llm.reset() // the turn after the tool call never came
      llm.enqueue(shell(`sleep 3${marker}.5`), {text: 'not reached'})
      const running = sendProcess('free', 'sleep')
      await waitFor('the tool command', () => processesWith(`3${marker}.5`).length > 0).catch(async (error) => {
        running.kill('SIGKILL')
        const result = await running
        throw new Error(
          `${(error as Error).message}: ${String(result.stdout)} ${String(result.stderr)} ${serve.output()}`,
        )
      })
      running.kill(signal)
      const result = await running
      if (signal === 'SIGINT') {
        expect(result.exitCode, String(result.stderr)).toBe(130)
        expect(String(result.stderr)).toMatch(/cancelled \(SIGINT\)/)
      }
      await waitFor('the run to be stopped', () => processesWith(`3${marker}.5`).length === 0, 5000)
    }
    await waitFor(
      'both records to end',
      () => recordedRuns().every((run) => run.status !== 'running') && recordedRuns(),
    )
    expect(recordedRuns().map((run) => run.status)).toEqual(['interrupted', 'interrupted'])
  })

  it('a gateway killed mid-run: send says so and exits non-zero, and nothing of the run or the standby survives', async () => {
    home = makeHome(fakeLlmConfig(llm.openaiBaseUrl, [{id: 'free', file_access: {unrestricted: true}}]))
    const workspace = home.workspace('free')
    const serve = await startServe()
    llm.enqueue({text: 'warm'})
    expect((await send('free', 'warm up')).exitCode).toBe(0)
    await waitFor('a standby agent-run', () => agentRunsIn(workspace).length === 1)
    const marker = uniqueMarker()
    llm.enqueue(shell(`sleep 3${marker}.5`), {text: 'not reached'})
    const running = send('free', 'sleep')
    await waitFor('the tool command', () => processesWith(`3${marker}.5`).length > 0)
    serve.process.kill('SIGKILL')
    const result = await running
    expect(result.exitCode).toBe(8)
    expect(result.stderr).toMatch(/the gateway stopped before it sent the result/)
    await waitFor(
      'the run and the standby to die with their owner',
      () => processesWith(`3${marker}.5`).length === 0 && agentRunsIn(workspace).length === 0,
      5000,
    )
    // its socket and token are left behind: the next send finds nobody answering and runs the message itself
    expect(fs.existsSync(localSendToken(home.home))).toBe(true)
    llm.reset() // the turn after the tool call never came
    llm.enqueue({text: 'one-shot after the crash'})
    const after = await send('free', 'hi')
    expect(after.exitCode, after.stderr).toBe(0)
    expect(after.stdout.trim()).toBe('one-shot after the crash')
    // and the next gateway takes the place over
    await startServe()
    llm.enqueue({text: 'through the new gateway'})
    expect((await send('free', 'hi')).stdout.trim()).toBe('through the new gateway')
    expect(recordedRuns().filter((run) => run.status === 'ok')).toHaveLength(2)
  })

  it('a gateway stopped with SIGTERM ends its standby agent-runs and removes its socket and token', async () => {
    home = makeHome(fakeLlmConfig(llm.openaiBaseUrl, [{id: 'free', file_access: {unrestricted: true}}]))
    const workspace = home.workspace('free')
    const serve = await startServe()
    llm.enqueue({text: 'ok'})
    expect((await send('free', 'hi')).exitCode).toBe(0)
    await waitFor('a standby agent-run', () => agentRunsIn(workspace).length === 1)
    serve.process.kill('SIGTERM')
    await serve.process
    expect(agentRunsIn(workspace)).toEqual([])
    expect(fs.existsSync(localSendSocket(home.home))).toBe(false)
    expect(fs.existsSync(localSendToken(home.home))).toBe(false)
  })

  it('an agent whose timeout is shorter than the time its standby waited still gets its whole timeout (counted from its message)', async () => {
    home = makeHome(
      fakeLlmConfig(llm.openaiBaseUrl, [{id: 'free', file_access: {unrestricted: true}, timeout_seconds: 1}]),
    )
    const workspace = home.workspace('free')
    await startServe()
    llm.setDefault({text: 'in time'})
    expect((await send('free', 'hi')).exitCode).toBe(0)
    await waitFor('a standby agent-run', () => agentRunsIn(workspace).length === 1)
    await new Promise((resolve) => setTimeout(resolve, 1500))
    const late = await send('free', 'hi')
    expect(late.exitCode, late.stderr).toBe(0)
    expect(late.stdout.trim()).toBe('in time')
  })
})

describe('who may hand the gateway a message', {timeout: 90_000}, () => {
  /** One request on the socket, as any local process could send it; the gateway's answer lines. */
  async function ask(request: unknown): Promise<string[]> {
    const socket = net.connect(localSendSocket(home!.home))
    socket.write(`${typeof request === 'string' ? request : JSON.stringify(request)}\n`)
    let text = ''
    socket.on('data', (chunk) => (text += String(chunk)))
    await new Promise((resolve) => socket.on('close', resolve))
    return text.split('\n').filter(Boolean)
  }

  it("the socket and its token are the operator's alone (0600 in a 0700 directory), and a request without the token runs nothing", async () => {
    home = makeHome(fakeLlmConfig(llm.openaiBaseUrl, [{id: 'free', file_access: {unrestricted: true}}]))
    const serve = await startServe()
    expect(fs.statSync(path.dirname(localSendSocket(home.home))).mode & 0o777).toBe(0o700)
    expect(fs.statSync(localSendSocket(home.home)).mode & 0o777).toBe(0o600)
    expect(fs.statSync(localSendToken(home.home)).mode & 0o777).toBe(0o600)
    llm.setDefault({text: 'should not run'})
    const request = {
      type: 'send',
      version: 1,
      agent: 'free',
      channel: 'cli',
      content: 'hi',
      user: {id: 'x', name: 'x'},
      unrestricted: false,
      config_path: home.configPath,
      digest: 'x',
    }
    for (const token of [
      undefined,
      '',
      'guess',
      fs.readFileSync(localSendToken(home.home), 'utf8').replace(/.$/, (last) => (last === '0' ? '1' : '0')),
    ]) {
      const answer = await ask({...request, token})
      expect(answer).toEqual([
        JSON.stringify({type: 'refused', message: "the request does not carry this gateway's token"}),
      ])
    }
    expect(await ask('not json')).toEqual([JSON.stringify({type: 'refused', message: 'the request is not JSON'})])
    expect(llm.requests).toHaveLength(0)
    expect(serve.output()).toMatch(/refused a send over .*send\.sock: the request does not carry this gateway's token/)
  })

  it.skipIf(!requireLandlockOrSkip('send through the gateway from inside the host sandbox'))(
    'a sandboxed agent cannot hand the gateway a message for an unrestricted agent: it can neither read the token nor connect without it',
    async () => {
      home = makeHome(
        fakeLlmConfig(llm.openaiBaseUrl, [{id: 'free', file_access: {unrestricted: true}}, {id: 'boxed'}]),
      )
      expect((await runCli(['agent', 'create', 'boxed'], {home: home.home})).exitCode).toBe(0)
      await startServe()
      llm.setDefault({text: 'ESCAPED through the gateway'})
      // our own CLI, run inside the sandbox against the gateway's home
      const viaCli = await runCli(
        [
          'sandbox',
          'exec',
          '--agent',
          'boxed',
          '--',
          'env',
          `MEEPAGATEWAY_HOME=${home.home}`,
          process.execPath,
          BIN,
          'send',
          '--agent',
          'free',
          'hi',
        ],
        {home: home.home},
      )
      expect(viaCli.exitCode, viaCli.stdout + viaCli.stderr).not.toBe(0)
      expect(viaCli.stdout).not.toContain('ESCAPED')
      // by hand: read the token, or connect and try without it
      const script = `
      const fs = require('node:fs'), net = require('node:net')
      try { console.log('TOKEN:' + fs.readFileSync(${JSON.stringify(localSendToken(home.home))}, 'utf8')) } catch (e) { console.log('no token: ' + e.code) }
      const socket = net.connect(${JSON.stringify(localSendSocket(home.home))})
      socket.on('error', (e) => console.log('no socket: ' + e.code))
      socket.on('connect', () => socket.write(JSON.stringify({type: 'send', version: 1, token: 'x', agent: 'free', channel: 'c', content: 'hi', user: {id: 'a', name: 'a'}, unrestricted: false, config_path: '', digest: ''}) + '\\n'))
      socket.on('data', (d) => process.stdout.write('ANSWER:' + d))`
      const byHand = await runCli(['sandbox', 'exec', '--agent', 'boxed', '--', process.execPath, '-e', script], {
        home: home.home,
      })
      expect(byHand.stdout).not.toContain('TOKEN:')
      expect(byHand.stdout).toMatch(/no token: (EACCES|ENOENT|EPERM)/)
      expect(byHand.stdout).toMatch(/no socket: (EACCES|ENOENT|EPERM|ECONNREFUSED)|ANSWER:\{"type":"refused"/)
      expect(llm.requests).toHaveLength(0)
      expect(recordedRuns()).toEqual([])
    },
  )
})

describe('the client side', {timeout: 90_000}, () => {
  it('finding a gateway but no config leaves nothing open (send then says what a one-shot run says)', async () => {
    home = makeHome(fakeLlmConfig(llm.openaiBaseUrl, [{id: 'free', file_access: {unrestricted: true}}]))
    await startServe()
    const {sendThroughGateway} = await import('../../../../src/runtime/connectors/local-send/client.js')
    const env = {...process.env, MEEPAGATEWAY_HOME: home.home}
    const open = () => fs.readdirSync('/proc/self/fd').length
    const before = open()
    for (let index = 0; index < 5; index++) {
      expect(
        await sendThroughGateway({
          agentId: 'free',
          channel: 'cli',
          content: 'hi',
          configPath: path.join(home.home, 'missing.yaml'),
          env,
        }),
      ).toBeUndefined()
    }
    expect(open()).toBe(before)
  })
})

describe('what the gateway takes, and what it leaves to send', {timeout: 90_000}, () => {
  it('a message waiting behind another run of its agent is dropped when send is interrupted: exit 130 at once, recorded as interrupted, the run ahead untouched', async () => {
    home = makeHome(fakeLlmConfig(llm.openaiBaseUrl, [{id: 'free', file_access: {unrestricted: true}}]))
    await startServe()
    const marker = uniqueMarker()
    llm.enqueue(shell(`sleep 3; echo ahead-${marker}`), (request) => ({text: lastToolResult(request)}))
    const ahead = send('free', 'the run ahead')
    await waitFor('the run ahead', () => recordedRuns().length === 1)
    const waiting = sendProcess('free', 'waits its turn')
    await new Promise((resolve) => setTimeout(resolve, 700)) // time for send to start and hand it over
    const interrupted = Date.now()
    waiting.kill('SIGINT')
    const result = await waiting
    expect(Date.now() - interrupted).toBeLessThan(2000)
    expect(result.exitCode, String(result.stderr)).toBe(130)
    expect(String(result.stderr)).toMatch(/cancelled \(SIGINT\) before it started/)
    expect((await ahead).stdout).toContain(`ahead-${marker}`)
    await waitFor(
      'both records',
      () => recordedRuns().length === 2 && recordedRuns().every((run) => run.status !== 'running'),
    )
    expect(recordedRuns().map((run) => run.status)).toEqual(['ok', 'interrupted'])
    expect(llm.requests).toHaveLength(2) // the dropped message never reached the model
  })

  it("past its connections the gateway declines (send runs the message itself), and a message too long for it runs one-shot too, never failing as 'the gateway stopped'", async () => {
    home = makeHome(fakeLlmConfig(llm.openaiBaseUrl, [{id: 'free', file_access: {unrestricted: true}}]))
    await startServe()
    llm.setDefault({text: 'ok'})
    // 32 connections that never say a word (any local process of this user can open them)
    const idle = await Promise.all(
      Array.from(
        {length: 32},
        () =>
          new Promise<net.Socket>((resolve) => {
            const socket = net.connect(localSendSocket(home!.home), () => resolve(socket))
            socket.on('error', () => resolve(socket))
          }),
      ),
    )
    const crowded = await send('free', 'hi')
    expect(crowded.exitCode, crowded.stderr).toBe(0)
    expect(crowded.stdout.trim()).toBe('ok')
    for (const socket of idle) socket.destroy()
    // past the gateway's 8 MiB request line (stdin carries it; an argument could not): the
    // one-shot run's own answer (agent-run's frames have the same limit), not "the gateway stopped"
    const long = await send('free', '-', {input: 'x'.repeat(9 * 1024 * 1024)})
    expect(long.stderr).toMatch(/agent-run broke the LLM channel protocol: it sent a frame of/)
    expect(long.stderr).not.toMatch(/the gateway stopped/)
    expect(recordedRuns()).toEqual([])
    // a hello line past 4 KiB, without the token: closed before it is read whole
    const socket = net.connect(localSendSocket(home.home))
    socket.on('error', () => {})
    socket.write('{"type":"hello","token":"' + 'a'.repeat(8192))
    await new Promise((resolve) => socket.on('close', resolve))
    // and the gateway still takes messages
    expect((await send('free', 'hi')).exitCode).toBe(0)
    expect(recordedRuns()).toHaveLength(1)
  })

  it('a gateway running another build (an upgrade since it started) declines', async () => {
    home = makeHome(fakeLlmConfig(llm.openaiBaseUrl, [{id: 'free', file_access: {unrestricted: true}}]))
    const serve = await startServe()
    llm.setDefault({text: 'ok'})
    // what every build and install rewrites
    const marker = path.join(ROOT_DIR, 'dist', 'cli.sources.json')
    const {atime, mtime} = fs.statSync(marker)
    fs.utimesSync(marker, atime, new Date(mtime.getTime() + 5000))
    expect((await send('free', 'hi')).exitCode).toBe(0)
    expect(recordedRuns()).toEqual([])
    // restarted, it runs the new build: it takes messages again
    serve.process.kill('SIGTERM')
    await serve.process
    await startServe()
    expect((await send('free', 'hi')).exitCode).toBe(0)
    expect(recordedRuns()).toHaveLength(1)
  })

  it("send talks only to a gateway whose socket, token and directory are this user's alone", async () => {
    home = makeHome(fakeLlmConfig(llm.openaiBaseUrl, [{id: 'free', file_access: {unrestricted: true}}]))
    await startServe()
    llm.setDefault({text: 'ok'})
    for (const [file, mode] of [
      [localSendToken(home.home), 0o644],
      [localSendDir(home.home), 0o755],
      [localSendSocket(home.home), 0o666],
    ] as const) {
      const before = fs.statSync(file).mode & 0o777
      fs.chmodSync(file, mode)
      try {
        expect((await send('free', 'hi')).exitCode).toBe(0)
        expect(recordedRuns()).toEqual([])
      } finally {
        fs.chmodSync(file, before)
      }
    }
    expect((await send('free', 'hi')).exitCode).toBe(0)
    expect(recordedRuns()).toHaveLength(1)
  })
})

describe('a gateway in this process', {timeout: 90_000}, () => {
  const saved: Record<string, string | undefined> = {}
  /** The gateway reads its environment as send does: this process's, made equal to what runCli gives send. */
  function sendEnvironment(): void {
    for (const [name, value] of Object.entries({
      MEEPAGATEWAY_HOME: home!.home,
      FAKE_LLM_KEY: 'sk-fake-test-key-123456',
      ...SEND_ENV,
    })) {
      saved[name] = process.env[name]
      process.env[name] = value
    }
  }
  afterEach(() => {
    for (const [name, value] of Object.entries(saved)) {
      if (value === undefined) delete process.env[name]
      else process.env[name] = value
    }
  })
  const log = () => {}

  it('compares send with the config text it runs (parsed at its start), not with the file as it reads later', async () => {
    const config = fakeLlmConfig(llm.openaiBaseUrl, [{id: 'free', file_access: {unrestricted: true}}])
    home = makeHome(config)
    sendEnvironment()
    const loaded = loadConfig({configPath: home.configPath, home: home.home})
    // the file changes before the gateway is up: the agent is sandboxed now, the gateway still runs what it parsed
    home.writeConfig(
      fakeLlmConfig(llm.openaiBaseUrl, [{id: 'free', max_iterations: 4, file_access: {unrestricted: true}}]),
    )
    const gateway = await startGateway({loaded, port: 0, log})
    try {
      llm.setDefault({text: 'ok'})
      expect((await send('free', 'hi')).exitCode).toBe(0)
      expect(recordedRuns()).toEqual([])
      // the file as the gateway parsed it: taken
      home.writeConfig(config)
      expect((await send('free', 'hi')).exitCode).toBe(0)
      expect(recordedRuns()).toHaveLength(1)
    } finally {
      await gateway.stop({graceMs: 5000})
    }
  })

  it('starts no standby agent-run once it is stopping: none is left when stop() returns, even for a run that ended during the stop', async () => {
    home = makeHome(fakeLlmConfig(llm.openaiBaseUrl, [{id: 'free', file_access: {unrestricted: true}}]))
    const workspace = home.workspace('free')
    sendEnvironment()
    const gateway = await startGateway({
      loaded: loadConfig({configPath: home.configPath, home: home.home}),
      port: 0,
      log,
    })
    llm.enqueue(shell('sleep 1'), {text: 'done during the stop'})
    const running = send('free', 'sleep a second')
    await waitFor('the run', () => recordedRuns().length === 1)
    await gateway.stop({graceMs: 10_000})
    expect((await running).stdout.trim()).toBe('done during the stop')
    await new Promise((resolve) => setTimeout(resolve, 300))
    expect(agentRunsIn(workspace)).toEqual([])
  })
})

describe('send and a gateway that misbehaves or is run elsewhere', {timeout: 90_000}, () => {
  it("a send in another process context (here a umask of its own) runs the message itself: the gateway's run would not inherit it", async () => {
    home = makeHome(fakeLlmConfig(llm.openaiBaseUrl, [{id: 'free', file_access: {unrestricted: true}}]))
    await startServe()
    llm.enqueue(shell('umask; touch made-here && stat -c %a made-here'), (request) => ({text: lastToolResult(request)}))
    const env = {MEEPAGATEWAY_HOME: home.home, FAKE_LLM_KEY: 'sk-fake-test-key-123456', ...SEND_ENV}
    const wrapped = await execa('sh', ['-c', `umask 077; exec "${process.execPath}" "${BIN}" send --agent free hi`], {
      env,
      reject: false,
    })
    expect(wrapped.exitCode, String(wrapped.stderr)).toBe(0)
    expect(String(wrapped.stdout)).toMatch(/0077[\s\S]*600/)
    expect(recordedRuns()).toEqual([])
  })

  it('a gateway that stops answering (SIGSTOP) does not hang send: it gives up after 10 s, or 15 s after Ctrl-C, and says so', async () => {
    home = makeHome(fakeLlmConfig(llm.openaiBaseUrl, [{id: 'free', file_access: {unrestricted: true}}]))
    const serve = await startServe()
    llm.setDefault({text: 'ok'})
    serve.process.kill('SIGSTOP')
    try {
      const started = Date.now()
      const interrupted = sendProcess('free', 'hi')
      const left = send('free', 'hi')
      await new Promise((resolve) => setTimeout(resolve, 1500))
      interrupted.kill('SIGINT')
      const [stopped, waited] = await Promise.all([interrupted, left])
      expect(stopped.exitCode, String(stopped.stderr)).toBe(130)
      expect(String(stopped.stderr)).toMatch(/the gateway did not end the run within 15 s of SIGINT/)
      expect(waited.exitCode, waited.stderr).toBe(8)
      expect(waited.stderr).toMatch(/the gateway did not answer within 10 s/)
      expect(Date.now() - started).toBeLessThan(25_000)
      expect(llm.requests).toHaveLength(0) // neither ran it here: the gateway may still have it
    } finally {
      serve.process.kill('SIGCONT')
    }
  })

  it('a message still waiting when the gateway stops is handed back: send runs it itself', async () => {
    home = makeHome(fakeLlmConfig(llm.openaiBaseUrl, [{id: 'free', file_access: {unrestricted: true}}]))
    const serve = await startServe()
    // each message gets its own answers, whichever run asks first
    llm.setDefault((request) => {
      const messages = request.body.messages as Array<{role: string; content: unknown}>
      if (messages.some((message) => message.role === 'user' && message.content === 'waits its turn'))
        return {text: 'run by send itself'}
      return messages.at(-1)?.role === 'tool' ? {text: lastToolResult(request)} : shell('sleep 2; echo first-done')
    })
    const first = send('free', 'the run ahead')
    await waitFor('the run ahead', () => recordedRuns().length === 1)
    const second = send('free', 'waits its turn')
    await new Promise((resolve) => setTimeout(resolve, 700)) // time for send to hand it over
    serve.process.kill('SIGTERM')
    const [a, b] = await Promise.all([first, second])
    expect(a.stdout).toContain('first-done')
    expect(b.exitCode, b.stderr).toBe(0)
    expect(b.stdout.trim()).toBe('run by send itself')
  })

  it('a standby agent-run that cannot be started (its TMPDIR gone) is logged; the gateway goes on', async () => {
    home = makeHome(fakeLlmConfig(llm.openaiBaseUrl, [{id: 'free', file_access: {unrestricted: true}}]))
    const tmp = path.join(home.home, 'tmp')
    fs.mkdirSync(tmp)
    const serve = await startServe({...SEND_ENV, TMPDIR: tmp})
    const env = {TMPDIR: tmp}
    llm.setDefault({text: 'ok'})
    expect((await send('free', 'hi', {env})).exitCode).toBe(0)
    await waitFor('a standby agent-run', () => agentRunsIn(home!.workspace('free')).length === 1)
    // this run takes the standby (its TMPDIR whole until then); the next one cannot be started
    llm.enqueue(() => {
      fs.rmSync(tmp, {recursive: true, force: true})
      return {text: 'ok'}
    })
    expect((await send('free', 'hi', {env})).exitCode).toBe(0)
    await waitFor('the log line', () => /could not start a standby agent-run: .*ENOENT/.test(serve.output()))
    await new Promise((resolve) => setTimeout(resolve, 300))
    expect(serve.process.exitCode).toBe(null)
    fs.mkdirSync(tmp)
    expect((await send('free', 'hi', {env})).exitCode).toBe(0)
    expect(recordedRuns()).toHaveLength(3)
  })
})
