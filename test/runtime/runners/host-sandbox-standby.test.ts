import fs from 'node:fs'
import path from 'node:path'
import {afterAll, afterEach, beforeAll, describe, expect, it} from 'vitest'
import {startFakeLlm, type FakeLlm} from '../../fakes/llm-server.js'
import {fakeLlmConfig, makeHome, ROOT, runCli, type TestHome} from '../../helpers/home.js'
import {startServeProcess} from '../../helpers/serve-process.js'
import {agentRunsIn} from '../../helpers/processes.js'
import {requireLandlockOrSkip} from '../../helpers/landlock-support.js'
import {waitFor} from '../../helpers/wait-for.js'
import {runShellWithStandby} from '../../helpers/standby-message.js'
import {stopStandbyAgentRuns} from '../../../src/runtime/runners/standby-agent-runs.js'
import {standbyUsage} from '../../../src/runtime/runners/standby-budget.js'
import {NO_NAMESPACES_ENV} from '../../../src/sandbox/bwrap/namespaces.js'

/*
 * Standby agent-runs of host-sandbox agents, on the path a running gateway takes (runMessage with
 * `standby`): after a run, the agent's next agent-run is started in its namespaces, under its
 * helper, keeper and cgroups, and waits for its input. What must hold is what a cold run gives:
 * a fresh TMPDIR, a deadline from the message, the rules of the config as it is at the message,
 * and a standby that was killed or tampered with while it waited is never used.
 */
const enabled = requireLandlockOrSkip('host-sandbox standby agent-runs')

// The scripted command prints where it runs: its TMPDIR (a cold run's name carries the run id, a
// standby's its own), what is in it, its size (limits.disk) and how many processes its /proc shows.
const PROBE = [
  'echo "tmp=$TMPDIR"',
  'echo "tmpfiles=[$(ls -A "$TMPDIR" | tr "\\n" " ")]"',
  'echo "limit=$(df -k --output=size "$TMPDIR" | tail -1)"',
  'echo "procs=$(ls /proc | grep -c "^[0-9]")"',
].join('; ')

describe.skipIf(!enabled)('host sandbox: standby agent-runs of a running gateway', () => {
  let llm: FakeLlm
  let home: TestHome
  const logs: string[] = []
  const agent = (extra: Record<string, unknown> = {}) => ({id: 'warm', timeout_seconds: 20, ...extra})
  const configure = (extra: Record<string, unknown> = {}) =>
    home.writeConfig(fakeLlmConfig(llm.openaiBaseUrl, [agent(extra)]))

  const send = async (command: string) => {
    logs.length = 0
    const result = await runShellWithStandby(llm, home, 'warm', command, (line) => logs.push(line))
    return {result, reply: result.output.ok ? result.output.reply.content : JSON.stringify(result.output.error)}
  }
  const probe = async () => {
    const {result, reply} = await send(PROBE)
    expect(result.output.ok, reply).toBe(true)
    const field = (name: string) => new RegExp(`${name}=(.*)`).exec(reply)?.[1]?.trim() ?? ''
    return {
      warm: !field('tmp').includes(result.runId.slice(0, 12)),
      tmpFiles: field('tmpfiles')
        .replace(/^\[|\]$/g, '')
        .trim(),
      limit: field('limit'),
      procs: Number(field('procs')),
      logs: logs.join('\n'),
    }
  }
  /** The standby's agent-run, once it waits (one agent-run working in the workspace). */
  const standby = () =>
    waitFor(
      'a standby agent-run',
      () => {
        const pids = agentRunsIn(home.workspace('warm'))
        return pids.length === 1 && pids[0]
      },
      20_000,
    )

  beforeAll(async () => {
    llm = await startFakeLlm()
    process.env.FAKE_LLM_KEY = 'sk-fake-test-key-123456'
  })
  afterEach(async () => {
    await stopStandbyAgentRuns()
    home?.cleanup()
  })
  afterAll(async () => {
    await llm.close()
  })

  it('serves the next message in a standby, with a TMPDIR nothing wrote to and nothing of the previous run', async () => {
    home = makeHome()
    configure()
    const first = await send(
      'echo left > "$TMPDIR/left-by-first"; (sleep 300 >/dev/null 2>&1 &) ; echo outside > /tmp/meepa-outside-grants 2>&1; echo done',
    )
    expect(first.result.output.ok, first.reply).toBe(true)
    expect(fs.existsSync('/tmp/meepa-outside-grants')).toBe(false)
    const waiting = await standby()
    // what it holds while it waits (agent-run, the helper's keeper, bubblewrap) is counted
    expect(standbyUsage()).toMatchObject({count: 1, by_level: {'host-sandbox': {count: 1}}})
    // once its agent-run has loaded (it may still be starting when the standby is first seen)
    await waitFor(
      'the standby counted with its loaded agent-run',
      () => standbyUsage().resident_bytes > 10 * 1024 * 1024,
    )
    const second = await probe()
    expect(second.warm, second.logs).toBe(true)
    expect(second.tmpFiles).toBe('')
    // its own PID namespace: none of the first run's processes (its `sleep`) are there
    expect(second.procs).toBeLessThan(12)
    expect(second.logs).not.toMatch(/cold/)
    expect(fs.existsSync(`/proc/${waiting}`)).toBe(false)
    // and the next one waits already
    expect(await standby()).not.toBe(waiting)
  }, 90_000)

  // Issue 25: a waiting agent-run costs ≤ 45 MB RSS (52 MB when it loaded execa and both LLM SDKs ahead)
  it('a waiting standby agent-run, loaded, holds at most 45 MB resident', async () => {
    home = makeHome()
    configure()
    expect((await send('true')).result.output.ok).toBe(true)
    const waiting = await standby()
    const resident = () =>
      Number(/VmRSS:\s+(\d+) kB/.exec(fs.readFileSync(`/proc/${waiting}/status`, 'utf8'))?.[1]) * 1024
    // loaded: what it reads ahead of its input (its loop, SQLite's JavaScript) is in
    await waitFor('its modules loaded', () => resident() > 30 * 1024 * 1024)
    await new Promise((resolve) => setTimeout(resolve, 1500))
    expect(resident() / 1024 / 1024).toBeLessThanOrEqual(45)
  }, 60_000)

  it('counts the deadline from the message, not from when the standby started', async () => {
    home = makeHome()
    configure({timeout_seconds: 3})
    expect((await send('true')).result.output.ok).toBe(true)
    await standby()
    await new Promise((resolve) => setTimeout(resolve, 4000))
    const onTime = await send('sleep 1; echo slept')
    expect(onTime.reply).toContain('slept')
    await standby()
    const started = Date.now()
    const late = await send('sleep 30')
    expect(late.result.output).toMatchObject({ok: false, error: {code: 'E_TIMEOUT'}})
    expect(Date.now() - started).toBeLessThan(8000)
  }, 90_000)

  type Probe = Awaited<ReturnType<typeof probe>>
  it.each<[string, Record<string, unknown>, (before: Probe, after: Probe) => void]>([
    [
      'limits',
      {limits: {disk: '64m'}},
      (before, after) => {
        expect(before.limit).toBe(String(1024 * 1024))
        expect(after.limit).toBe(String(64 * 1024))
      },
    ],
    ["the agent's config", {max_iterations: 7}, () => {}],
  ])(
    'a change of %s between two messages: the standby is ended and the message runs cold under the new rules',
    async (_what, change, check) => {
      home = makeHome()
      configure()
      expect((await send('true')).result.output.ok).toBe(true)
      await standby()
      const before = await probe()
      expect(before.warm).toBe(true)
      await standby()
      configure(change)
      const after = await probe()
      expect(after.warm).toBe(false)
      expect(after.logs).toMatch(
        /not using the standby agent-run prepared for this agent: the agent's config(, .*)? changed/,
      )
      check(before, after)
    },
    90_000,
  )

  it('a grant added between two messages is writable in the second', async () => {
    home = makeHome()
    const granted = fs.mkdtempSync('/var/tmp/meepa-standby-grant-')
    try {
      configure()
      expect((await send('true')).result.output.ok).toBe(true)
      await standby()
      configure({file_access: {allow_read_write: [granted]}})
      const second = await send(`echo hi > ${granted}/written && echo wrote`)
      expect(second.reply).toContain('wrote')
      expect(logs.join('\n')).toMatch(/the sandbox policy and launch .* changed/)
      expect(fs.readFileSync(path.join(granted, 'written'), 'utf8')).toBe('hi\n')
    } finally {
      fs.rmSync(granted, {recursive: true, force: true})
    }
  }, 90_000)

  it('a new app build or a new answer of the namespace probe ends the standby', async () => {
    home = makeHome()
    configure({file_access: {best_effort: true}})
    expect((await send('true')).result.output.ok).toBe(true)
    await standby()
    const marker = path.join(ROOT, 'dist', 'cli.sources.json')
    const stat = fs.statSync(marker)
    fs.utimesSync(marker, stat.atime, new Date(stat.mtimeMs + 5000))
    let rebuilt
    try {
      rebuilt = await probe()
    } finally {
      fs.utimesSync(marker, stat.atime, stat.mtime)
    }
    expect(rebuilt.warm).toBe(false)
    expect(rebuilt.logs).toMatch(/the app build changed/)
    await standby()
    // bubblewrap's namespaces go away: the next message runs in the fallback, every host process in its /proc
    process.env[NO_NAMESPACES_ENV] = '1'
    try {
      const bare = await probe()
      expect(bare.warm).toBe(false)
      expect(bare.logs).toMatch(/the sandbox policy and launch .* changed/)
      expect(bare.procs).toBeGreaterThan(20)
    } finally {
      delete process.env[NO_NAMESPACES_ENV]
    }
  }, 120_000)

  it('a message the sandbox now refuses (E_SANDBOX) ends the standby made under the old rules', async () => {
    home = makeHome()
    configure()
    expect((await send('true')).result.output.ok).toBe(true)
    const pid = await standby()
    // without bubblewrap and without best_effort the host sandbox cannot be enforced: refused
    process.env[NO_NAMESPACES_ENV] = '1'
    try {
      const refused = await send('true')
      expect(refused.result.output).toMatchObject({ok: false, error: {code: 'E_SANDBOX'}})
      await waitFor('the standby to end', () => !fs.existsSync(`/proc/${pid}`))
    } finally {
      delete process.env[NO_NAMESPACES_ENV]
    }
  }, 90_000)

  it('a gateway killed with SIGKILL takes its waiting standby with it: processes, cgroups and TMPDIR', async () => {
    home = makeHome()
    home.writeConfig(fakeLlmConfig(llm.openaiBaseUrl, [agent()], {captain: {port: 0}}))
    const serve = await startServeProcess({home: home.home, args: [], env: {MEEPA_RETRY_BASE_MS: '20'}})
    try {
      llm.reset()
      llm.setDefault({text: 'ok'})
      const sent = await runCli(['send', '--agent', 'warm', 'hi'], {home: home.home})
      expect(sent.exitCode, sent.stderr).toBe(0)
      const pid = await standby()
      const tmp = tmpOf(pid)
      const cgroups = runCgroupsOf(pid)
      expect(cgroups.length).toBeGreaterThan(0)
      serve.process.kill('SIGKILL')
      await serve.process.catch(() => {})
      await waitFor('the standby to end', () => !fs.existsSync(`/proc/${pid}`))
      await waitFor('its TMPDIR and cgroups removed', () => ![tmp, ...cgroups].some((dir) => fs.existsSync(dir)))
    } finally {
      serve.process.kill('SIGKILL')
    }
  }, 90_000)

  describe('a standby killed or tampered with while it waits is never used', () => {
    const tamperings: Array<[string, (pid: number, tmp: string) => unknown, RegExp]> = [
      ['its agent-run killed', (pid) => killAndWait(pid), /agent-run is no longer|keeper .* is gone|no process/],
      ['its keeper killed', (pid) => killAndWait(keeperOf(pid)), /keeper .* is gone|no process|no longer/],
      [
        'its cgroup removed (its processes moved out first)',
        (pid) => {
          for (const cgroup of runCgroupsOf(pid)) {
            for (const member of fs.readFileSync(path.join(cgroup, 'cgroup.procs'), 'utf8').split('\n').filter(Boolean))
              fs.writeFileSync(path.join(path.dirname(cgroup), 'cgroup.procs'), member)
            fs.rmdirSync(cgroup)
          }
        },
        /its cgroup .* is gone/,
      ],
      [
        'its TMPDIR replaced on the host',
        (_pid, tmp) => {
          fs.renameSync(tmp, `${tmp}-moved`)
          fs.mkdirSync(tmp, {mode: 0o700})
        },
        /its TMPDIR .* was replaced/,
      ],
      [
        'its TMPDIR removed on the host',
        (_pid, tmp) => fs.rmdirSync(tmp),
        /its run cannot be planned with it \(the private temp dir .* does not exist/,
      ],
      [
        'a file planted in its TMPDIR inside its namespace',
        (pid, tmp) => fs.writeFileSync(`/proc/${pid}/root${tmp}/planted`, 'x'),
        /something was written in its TMPDIR/,
      ],
    ]
    it.each(tamperings)(
      '%s: the message runs cold and the log says why',
      async (_what, tamper, why) => {
        home = makeHome()
        configure()
        expect((await send('true')).result.output.ok).toBe(true)
        const pid = await standby()
        const tmp = tmpOf(pid)
        await tamper(pid, tmp)
        const next = await probe()
        expect(next.warm).toBe(false)
        expect(next.tmpFiles).toBe('')
        expect(next.logs).toMatch(/not using the standby agent-run prepared for this agent: /)
        expect(next.logs).toMatch(why)
        fs.rmSync(`${tmp}-moved`, {recursive: true, force: true})
      },
      90_000,
    )
  })
})

/** A process's TMPDIR, from its environment. */
function tmpOf(pid: number): string {
  const entry = fs
    .readFileSync(`/proc/${pid}/environ`, 'utf8')
    .split('\0')
    .find((line) => line.startsWith('TMPDIR='))
  return String(entry).slice('TMPDIR='.length)
}

/** The run's own cgroup directories a process is in (v1: one per hierarchy; v2: one). */
function runCgroupsOf(pid: number): string[] {
  return fs
    .readFileSync(`/proc/${pid}/cgroup`, 'utf8')
    .trim()
    .split('\n')
    .flatMap((line) => {
      const [, controllers, dir] = line.split(':')
      if (!dir?.includes('run_')) return []
      return [path.join(controllers ? `/sys/fs/cgroup/${controllers.split(',')[0]}` : '/sys/fs/cgroup', dir)]
    })
}

/** SIGKILL, then until the process is gone (not even a zombie). */
async function killAndWait(pid: number): Promise<void> {
  process.kill(pid, 'SIGKILL')
  await waitFor(`process ${pid} to end`, () => {
    try {
      const stat = fs.readFileSync(`/proc/${pid}/stat`, 'utf8')
      return stat.slice(stat.lastIndexOf(')') + 2).startsWith('Z')
    } catch {
      return true
    }
  })
}

/** The keeper above a standby's agent-run: the ancestor whose command line has --keeper-fd. */
function keeperOf(pid: number): number {
  let current = pid
  for (let i = 0; i < 10; i++) {
    const stat = fs.readFileSync(`/proc/${current}/stat`, 'utf8')
    current = Number(stat.slice(stat.lastIndexOf(')') + 2).split(' ')[1])
    if (fs.readFileSync(`/proc/${current}/cmdline`, 'utf8').split('\0').includes('--keeper-fd')) return current
  }
  throw new Error(`no keeper above ${pid}`)
}
