import {spawn, spawnSync, type ChildProcess} from 'node:child_process'
import fs from 'node:fs'
import os from 'node:os'
import path from 'node:path'
import {afterAll, afterEach, beforeAll, describe, expect, it} from 'vitest'
import {fakeLlmConfig, makeHome, ROOT, type TestHome} from '../../helpers/home.js'
import {findAgent, loadConfig} from '../../../src/runtime/config/load.js'
import {buildAgentRunInput} from '../../../src/runtime/runners/run-message.js'
import {AgentRunChannel, type HostLlm} from '../../../src/runtime/llm-channel/host.js'
import {splitSyncTrailer} from '../../../src/runtime/runners/container/sync-trailer.js'
import {
  LOST_VOLUME_EXIT,
  LostVolume,
  SYNC_DIR,
  SYNC_FILL,
  SYNC_TAKEN,
  SYNC_TAKEN_WAIT_MS,
  syncGoLine,
  WORKSPACE_SYNC_ENV,
} from '../../../src/runtime/agent-run/workspace-changes.js'
import type {AgentRunOutput} from '../../../src/runtime/shapes/agent-run-contract.js'

/*
 * A sync engine's agent-run, after its trailer, waits for the runner to say it took the changes
 * (SYNC_TAKEN) before it exits: the container's teardown then no longer runs on the engine while
 * the host writes them. Here the built agent-run runs as the child of a PID namespace's init (the
 * one place it kills and sends a trailer, as under a container's --init), with the runner's own
 * channel and trailer reader on the other end.
 */
const FILL = 'b'.repeat(32)
const asRoot =
  process.getuid?.() === 0 && spawnSync('unshare', ['--pid', '--fork', 'true'], {stdio: 'ignore'}).status === 0

describe.skipIf(!asRoot)('agent-run on a sync engine ends when the runner has taken its changes', () => {
  let home: TestHome
  let child: ChildProcess | undefined
  const llm: HostLlm = {
    chat: async () => ({
      content: 'done',
      tool_calls: [],
      usage: {input_tokens: 1, output_tokens: 1},
      provider: 'fake',
      model: 'fake',
    }),
    maxCalls: 4,
  }

  beforeAll(() => {
    home = makeHome(fakeLlmConfig('http://127.0.0.1:9/v1', [{id: 'synced'}, {id: 'lost'}]))
  })
  afterEach(() => {
    if (child?.exitCode === null) child.kill('SIGKILL')
  })
  afterAll(() => home?.cleanup())

  /** The built agent-run as a sync engine's, its go line and input written; `exited` resolves with the time it ended. */
  const startRun = (agent: string) => {
    const loaded = loadConfig({configPath: home.configPath, home: home.home})
    const workspace = home.workspace(agent)
    const runId = `run_${Date.now()}`
    const input = buildAgentRunInput(
      loaded,
      findAgent(loaded, agent),
      {id: 'm', connector: 'cli', channel_id: 'c', user: {id: 'u', name: 'u'}, content: 'hi'},
      runId,
      workspace,
      'container',
      {available: {}, providerKeys: {}},
    )
    // sh is the namespace's PID 1: agent-run is its child, as under the container's init
    const started = spawn(
      'unshare',
      [
        '--pid',
        '--fork',
        '--kill-child',
        'sh',
        '-c',
        '"$0" "$@"',
        process.execPath,
        path.join(ROOT, 'bin', 'run.js'),
        'agent-run',
      ],
      {env: {...process.env, [WORKSPACE_SYNC_ENV]: '1'}, stdio: ['pipe', 'pipe', 'pipe']},
    )
    child = started
    const exited = new Promise<number>((resolve) => started.once('exit', () => resolve(performance.now())))
    const said = {stderr: ''}
    if (process.env.DEBUG_SYNC) started.stderr!.pipe(process.stderr)
    started.stderr!.on('data', (chunk: Buffer) => (said.stderr += chunk.toString()))
    started.stdin!.write(syncGoLine(runId, false, 64 << 20, FILL))
    return {started, exited, said, input}
  }

  /** One run up to its whole trailer. */
  const runToTrailer = async () => {
    fs.mkdirSync(path.join(home.workspace('synced'), SYNC_DIR), {recursive: true})
    fs.writeFileSync(path.join(home.workspace('synced'), SYNC_DIR, SYNC_FILL), `${FILL}\n`)
    const {started, exited, said, input} = startRun('synced')
    const split = splitSyncTrailer(started.stdout!, 64 << 20, path.join(os.tmpdir(), 'meepa-test-sync-spool'))
    const answered = new Promise<AgentRunOutput>((resolve) => {
      const channel: AgentRunChannel = new AgentRunChannel(
        started.stdin!,
        split.frames,
        input,
        llm,
        () => {},
        () => resolve(channel.outcome()!),
        undefined,
        true,
      )
    })
    const output = await answered
    expect(output.ok, said.stderr).toBe(true)
    const trailer = await split.trailer
    expect(trailer, said.stderr).toBeDefined()
    // the run's own writes are in it (its memory)
    expect(trailer!.list.read(0, trailer!.list.length).toString()).toContain('./memory.db')
    trailer!.close()
    return {child: started, exited, trailedAt: performance.now()}
  }

  it('ends before the run, with no frame, on a volume the host did not fill (no sync folder)', async () => {
    fs.mkdirSync(home.workspace('lost'), {recursive: true})
    fs.writeFileSync(path.join(home.workspace('lost'), 'kept.txt'), 'x')
    const {started, exited, said, input} = startRun('lost')
    let stdout = ''
    started.stdout!.on('data', (chunk: Buffer) => (stdout += chunk.toString()))
    started.stdin!.write(`${JSON.stringify(input)}\n`)
    await exited
    expect(started.exitCode, said.stderr).toBe(LOST_VOLUME_EXIT)
    expect(said.stderr).toContain(new LostVolume().message)
    expect(stdout).toBe('')
    expect(fs.readdirSync(home.workspace('lost'))).toEqual(['kept.txt'])
  }, 30_000)

  it('waits after its trailer until the runner says it took the changes, then ends at once', async () => {
    const run = await runToTrailer()
    const still = await Promise.race([run.exited.then(() => 'exited'), sleep(700).then(() => 'running')])
    expect(still).toBe('running')
    // the line alone, stdin left open (an engine may not pass its end on)
    const saidAt = performance.now()
    run.child.stdin!.write(`${SYNC_TAKEN}\n`)
    const endedAt = await run.exited
    expect(run.child.exitCode).toBe(0)
    expect(endedAt - saidAt).toBeLessThan(1_000)
  }, 30_000)

  it('ends at the end of its stdin (the runner went away) without waiting out its limit', async () => {
    const run = await runToTrailer()
    run.child.stdin!.end()
    const endedAt = await run.exited
    expect(endedAt - run.trailedAt).toBeLessThan(1_000)
  }, 30_000)

  it('ends by itself when the runner never says it: a container is never kept', async () => {
    const run = await runToTrailer()
    const endedAt = await run.exited
    expect(endedAt - run.trailedAt).toBeGreaterThan(SYNC_TAKEN_WAIT_MS - 1_500)
    expect(endedAt - run.trailedAt).toBeLessThan(SYNC_TAKEN_WAIT_MS + 3_000)
  }, 30_000)
})

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms))
