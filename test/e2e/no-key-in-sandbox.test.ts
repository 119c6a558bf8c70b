import {randomBytes} from 'node:crypto'
import fs from 'node:fs'
import {afterAll, beforeAll, describe, expect, it} from 'vitest'
import {startFakeLlm, type FakeLlm} from '../fakes/llm-server.js'
import {fakeLlmConfig, makeHome, runCli, type TestHome} from '../helpers/home.js'
import {agentRunPids, whereHeld, type Holdings} from '../helpers/process-memory.js'
import {describeWithDocker} from '../helpers/docker-env.js'
import {loadConfig} from '../../src/runtime/config/load.js'
import {runMessage} from '../../src/runtime/runners/run-message.js'
import {stopStandbyContainers} from '../../src/runtime/runners/container/standby-pool.js'
import {stopStandbyAgentRuns} from '../../src/runtime/runners/standby-agent-runs.js'
import {agentRunsIn} from '../helpers/processes.js'
import {waitFor} from '../helpers/wait-for.js'

/*
 * Issue 11, criterion 1: at every level agent-run holds no provider key. While agent-run waits for
 * its first LLM answer, the fake LLM (called by the runner on the host) looks into every live
 * agent-run process: its environ, its cmdline and its writable memory (/proc/PID/mem, as root).
 * The message carries a marker, found in the memory of the run's agent-run: proof that the scan
 * looks at the right process and would see a string that is there. Agent-run run by hand, with the
 * key in its own environment, is the control that the scan finds a key where there is one.
 */

interface Scan {
  /** agent-run processes whose memory holds this run's marker. */
  runs: number
  /** Where the key was found in any agent-run process. */
  key: Holdings
}

function scanAgentRuns(marker: string, secrets: string[]): Scan {
  const scan: Scan = {runs: 0, key: {environ: false, cmdline: false, memory: false}}
  for (const pid of agentRunPids()) {
    try {
      if (whereHeld(pid, marker).memory) scan.runs++
      for (const secret of secrets) {
        const held = whereHeld(pid, secret)
        scan.key = {
          environ: scan.key.environ || held.environ,
          cmdline: scan.key.cmdline || held.cmdline,
          memory: scan.key.memory || held.memory,
        }
      }
    } catch {
      // a process that ended during the scan (another suite's run)
    }
  }
  return scan
}

const isRoot = process.getuid?.() === 0

describe.runIf(isRoot)('no provider key in agent-run, at any level (scans /proc as root)', () => {
  let llm: FakeLlm
  const homes: TestHome[] = []
  const key = `sk-only-on-the-host-${randomBytes(12).toString('hex')}`
  // the agent's own chat connector token is the gateway's too: agent-run's input leaves connectors out
  const chatToken = `chat-token-only-on-the-host-${randomBytes(12).toString('hex')}`

  beforeAll(async () => {
    llm = await startFakeLlm()
  })
  afterAll(async () => {
    await stopStandbyAgentRuns()
    await stopStandbyContainers()
    await llm.close()
    for (const home of homes) home.cleanup()
  })

  /** Scripts: the first LLM call scans agent-run, then a tool call, then the answer. */
  const scriptScan = (marker: string): Promise<Scan> =>
    new Promise((resolve) => {
      llm.reset()
      llm.enqueue(
        () => {
          resolve(scanAgentRuns(marker, [key, chatToken]))
          return {toolCalls: [{name: 'write_file', arguments: {path: 'scanned.txt', content: 'yes'}}]}
        },
        {text: 'scanned'},
      )
    })

  const homeWith = (agent: Record<string, unknown>, extra: Record<string, unknown> = {}) => {
    const home = makeHome(
      fakeLlmConfig(
        llm.openaiBaseUrl,
        [{id: 'a', connectors: [{type: 'discord', bot_token: '$CHAT_TOKEN'}], ...agent}],
        extra,
      ),
    )
    homes.push(home)
    return home
  }

  const sendAndScan = async (agent: Record<string, unknown>): Promise<Scan> => {
    const home = homeWith(agent)
    const marker = `marker-${randomBytes(8).toString('hex')}`
    const scanned = scriptScan(marker)
    const result = await runCli(['send', '--agent', 'a', '--json', `hello ${marker}`], {
      home: home.home,
      env: {FAKE_LLM_KEY: key, CHAT_TOKEN: chatToken},
      timeoutMs: 180_000,
    })
    expect(result.stderr).not.toContain(key)
    expect(JSON.parse(result.stdout)).toMatchObject({ok: true, reply: {content: 'scanned'}})
    expect(llm.requests[0]?.headers.authorization).toBe(`Bearer ${key}`) // the host did call with the key
    return scanned
  }

  it('control: agent-run run by hand holds the key from its own environment, and the scan finds it', async () => {
    const home = homeWith({file_access: {unrestricted: true}})
    fs.mkdirSync(home.workspace('a'), {recursive: true})
    const marker = `marker-${randomBytes(8).toString('hex')}`
    const scanned = scriptScan(marker)
    const input = {
      version: 1,
      run_id: 'run_by_hand',
      workspace: home.workspace('a'),
      secrets: {},
      agent: loadConfig({configPath: home.configPath, home: home.home, env: {FAKE_LLM_KEY: key, CHAT_TOKEN: chatToken}})
        .config.agents[0],
      providers: loadConfig({configPath: home.configPath, home: home.home, env: {CHAT_TOKEN: chatToken}}).config
        .providers,
      message: {id: 'm', connector: 'cli', channel_id: 'c', user: {id: 'u', name: 'u'}, content: `hello ${marker}`},
    }
    const result = await runCli(['agent-run'], {
      home: home.home,
      env: {FAKE_LLM_KEY: key, CHAT_TOKEN: chatToken},
      input: `${JSON.stringify(input, null, 2)}\n`,
    })
    expect(JSON.parse(result.stdout), result.stdout).toMatchObject({ok: true, reply: {content: 'scanned'}})
    const scan = await scanned
    expect(scan.runs).toBeGreaterThanOrEqual(1)
    expect(scan.key.environ).toBe(true)
    expect(scan.key.memory).toBe(true)
  })

  it('unrestricted: not in environ, cmdline or memory', async () => {
    const scan = await sendAndScan({file_access: {unrestricted: true}})
    expect(scan.runs).toBeGreaterThanOrEqual(1)
    expect(scan.key).toEqual({environ: false, cmdline: false, memory: false})
  })

  it('host sandbox (network off): not in environ, cmdline or memory', async () => {
    const scan = await sendAndScan({file_access: {allow_network: false}})
    expect(scan.runs).toBeGreaterThanOrEqual(1)
    expect(scan.key).toEqual({environ: false, cmdline: false, memory: false})
  })

  /** A message on a running gateway's path (runMessage with `standby`), with the key and the token in the environment. */
  const runWithStandby = (home: TestHome, content: string, onLog?: (line: string) => void) =>
    runMessage({
      loaded: loadConfig({
        configPath: home.configPath,
        home: home.home,
        env: {FAKE_LLM_KEY: key, CHAT_TOKEN: chatToken},
      }),
      agentId: 'a',
      message: {id: 'm', connector: 'cli', channel_id: 'c', user: {id: 'u', name: 'u'}, content},
      standby: true,
      onLog,
    })

  it('standby host-sandbox agent-run (waiting, then serving its message): not in environ, cmdline or memory', async () => {
    const home = homeWith({file_access: {allow_network: false}})
    llm.reset()
    llm.setDefault({text: 'cold'})
    expect((await runWithStandby(home, 'first')).output.ok).toBe(true)
    const [waiting] = await waitFor('a standby agent-run', () => {
      const pids = agentRunsIn(home.workspace('a'))
      return pids.length === 1 && pids
    })
    // waiting: it holds nothing of the gateway's
    for (const secret of [key, chatToken])
      expect(whereHeld(waiting!, secret)).toEqual({environ: false, cmdline: false, memory: false})
    const marker = `marker-${randomBytes(8).toString('hex')}`
    const scanned = scriptScan(marker)
    const logs: string[] = []
    const second = await runWithStandby(home, `hello ${marker}`, (line) => logs.push(line))
    expect(second.output).toMatchObject({ok: true, reply: {content: 'scanned'}})
    expect(logs.join('\n')).not.toMatch(/cold/)
    const scan = await scanned
    expect(scan.runs).toBeGreaterThanOrEqual(1)
    expect(scan.key).toEqual({environ: false, cmdline: false, memory: false})
  }, 120_000)

  describeWithDocker('containers', () => {
    it('container (network none): not in environ, cmdline or memory', async () => {
      const scan = await sendAndScan({container_mode: {enabled: true, network: 'none', timeout_seconds: 120}})
      expect(scan.runs).toBeGreaterThanOrEqual(1)
      expect(scan.key).toEqual({environ: false, cmdline: false, memory: false})
    }, 240_000)

    it('standby container (waiting, then serving its message): not in environ, cmdline or memory', async () => {
      const home = homeWith({container_mode: {enabled: true, network: 'none', timeout_seconds: 120}})
      llm.reset()
      llm.setDefault({text: 'cold'})
      const logs: string[] = []
      expect((await runWithStandby(home, 'first')).output.ok).toBe(true)
      const marker = `marker-${randomBytes(8).toString('hex')}`
      const scanned = scriptScan(marker)
      const second = await runWithStandby(home, `hello ${marker}`, (line) => logs.push(line))
      expect(second.output).toMatchObject({ok: true, reply: {content: 'scanned'}})
      expect(logs.join('\n')).toMatch(/running in standby container/)
      const scan = await scanned
      expect(scan.runs).toBeGreaterThanOrEqual(1)
      expect(scan.key).toEqual({environ: false, cmdline: false, memory: false})
    }, 240_000)
  })
})
