import {execa, execaSync} from 'execa'
import fs from 'node:fs'
import os from 'node:os'
import path from 'node:path'
import {afterEach, describe, expect, it} from 'vitest'
import type {FakeLlm} from '../../fakes/llm-server.js'
import {fakeLlmForTests} from '../../helpers/fake-llm-for-tests.js'
import {BIN, fakeLlmConfig, makeHome, ROOT, runCli, type TestHome} from '../../helpers/home.js'
import {processesWith, uniqueMarker} from '../../helpers/processes.js'
import {openGatewayDb} from '../../../src/runtime/state/gateway-db.js'
import type {AgentRunInput} from '../../../src/runtime/shapes/agent-run-contract.js'
import {resolveAgent} from '../../../src/runtime/config/load.js'
import {runAgentProcess} from '../../../src/runtime/run-lifecycle/agent-run-process.js'
import {HELPER} from '../../helpers/landlock-support.js'
import {cgroupSupport} from '../../../src/sandbox/run-cgroup.js'

/*
 * The moments around a run's start (found by an outside review of the change that starts
 * agent-run sooner: the run's record, send's reclaim of abandoned runs while the run starts).
 * Attacked here:
 * - a send SIGKILLed between creating the run's cgroups and its record: the next start-up must clean them;
 * - a stale record whose keeper pid the new run's keeper got again (a fresh pid namespace per send,
 *   as with `docker run ... send`): the reclaim must not kill the run that just started;
 * - a reclaim that throws: send must fail cleanly (JSON error with --json), not crash.
 */

let llm: FakeLlm
fakeLlmForTests((started) => (llm = started), {resetBeforeEach: true})

const homes: TestHome[] = []
const dirs: string[] = []
const mounts: string[] = []
const leftovers: string[] = []
afterEach(async () => {
  for (const dir of leftovers) {
    try {
      for (const pid of fs.readFileSync(path.join(dir, 'cgroup.procs'), 'utf8').split('\n').filter(Boolean))
        process.kill(Number(pid), 'SIGKILL')
      if (fs.existsSync(path.join(dir, 'freezer.state'))) fs.writeFileSync(path.join(dir, 'freezer.state'), 'THAWED')
    } catch {
      // gone
    }
  }
  for (const dir of leftovers.splice(0)) {
    for (let attempt = 0; attempt < 100 && fs.existsSync(dir); attempt++) {
      try {
        fs.rmdirSync(dir)
      } catch {
        await sleep(20)
      }
    }
  }
  for (const mount of mounts.splice(0)) execaSync('umount', [mount], {reject: false})
  for (const home of homes.splice(0)) home.cleanup()
  for (const dir of dirs.splice(0)) fs.rmSync(dir, {recursive: true, force: true})
})

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms))
async function until(check: () => boolean, ms = 5000): Promise<void> {
  const deadline = Date.now() + ms
  while (!check()) {
    if (Date.now() > deadline) throw new Error(`timed out after ${ms} ms`)
    await sleep(20)
  }
}
const has = (command: string) => execaSync('sh', ['-c', `command -v ${command}`], {reject: false}).exitCode === 0
const root = process.getuid?.() === 0
const cgroups = cgroupSupport()

/** A home with one unrestricted agent, and a private TMPDIR (the reclaim sweeps TMPDIR: it must not touch others'). */
function setup(): {home: TestHome; env: Record<string, string>; tmp: string} {
  const home = makeHome(fakeLlmConfig(llm.openaiBaseUrl, [{id: 'a1', file_access: {unrestricted: true}}]))
  homes.push(home)
  const tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'meepa-crash-tmp-'))
  dirs.push(tmp)
  return {home, env: {TMPDIR: tmp}, tmp}
}

/** Every run cgroup directory (v1: one per controller hierarchy; v2: one) whose name starts with `prefix`. */
function runCgroupDirs(prefix: string): string[] {
  const own = fs.readFileSync('/proc/self/cgroup', 'utf8')
  const parents: string[] = []
  for (const line of own.split('\n')) {
    const match = /^\d+:([^:]*):(.*)$/.exec(line)
    if (!match) continue
    const [, controllers, where] = match as unknown as [string, string, string]
    if (controllers === '') parents.push(path.join('/sys/fs/cgroup', where, 'meepa-runs'))
    for (const controller of controllers.split(','))
      if (['memory', 'pids', 'cpu', 'freezer'].includes(controller))
        parents.push(path.join('/sys/fs/cgroup', controller, where, 'meepagateway'))
  }
  return parents.flatMap((parent) => {
    try {
      return fs
        .readdirSync(parent)
        .filter((name) => name.startsWith(prefix))
        .map((name) => path.join(parent, name))
    } catch {
      return []
    }
  })
}

describe.runIf(process.platform === 'linux' && root)(
  'records and reclaim around the start of a run',
  {timeout: 120_000},
  () => {
    it.runIf(has('strace') && cgroups.mode !== 'none')(
      'a send SIGKILLed after it made the run cgroups but before it spawned: the next send removes them (the record must exist by then)',
      async () => {
        const {home, env, tmp} = setup()
        // the workspace first (under root it is a volume, made with child processes of its own)
        await execa(process.execPath, [BIN, 'agent', 'create', 'a1'], {env: {MEEPAGATEWAY_HOME: home.home, ...env}})
        // SIGKILL at the first socketpair(): node:child_process makes the run's stdio pipes with it, right before fork
        const killed = await execa(
          'strace',
          [
            '-f',
            '-o',
            '/dev/null',
            '-e',
            'trace=socketpair',
            '-e',
            'inject=socketpair:signal=KILL:when=1',
            process.execPath,
            BIN,
            'send',
            '--agent',
            'a1',
            'hi',
          ],
          {
            env: {MEEPAGATEWAY_HOME: home.home, FAKE_LLM_KEY: 'sk-fake-test-key-123456', ...env},
            reject: false,
          },
        )
        expect(killed.signal ?? killed.exitCode).toMatch(/SIGKILL|137/)
        // the run's id: its TMPDIR (meepa-run-<pid>-<first 12 characters of the run id>-...) was made first
        const left = fs.readdirSync(tmp).find((name) => name.startsWith('meepa-run-'))
        expect(left).toBeDefined()
        const prefix = /^meepa-run-\d+-(run_[0-9a-f]{8})-/.exec(left!)![1]!
        const leaked = runCgroupDirs(prefix)
        leftovers.push(...leaked)
        expect(leaked.length).toBeGreaterThan(0) // the cgroups were made before the kill
        llm.enqueue({text: 'hello'})
        const next = await runCli(['send', '--agent', 'a1', 'hi'], {home: home.home, env})
        expect(next.stdout.trim()).toBe('hello')
        expect(runCgroupDirs(prefix), 'run cgroups nobody will ever remove').toEqual([])
      },
    )

    it.runIf(has('unshare'))(
      "a send per fresh pid namespace (docker run ... send): a crashed send's stale keeper pid is the next run's keeper pid, and the reclaim must not kill that run",
      async () => {
        const {home, env} = setup()
        const inNamespace = (args: string[]) =>
          execa('unshare', ['--pid', '--fork', '--kill-child', '--mount-proc', process.execPath, BIN, ...args], {
            env: {
              MEEPAGATEWAY_HOME: home.home,
              FAKE_LLM_KEY: 'sk-fake-test-key-123456',
              MEEPA_RETRY_BASE_MS: '20',
              ...env,
            },
            reject: false,
          })
        // 1. a send whose run is busy is killed with its whole namespace (OOM, docker kill): keeper
        // included, the record stays
        const marker = uniqueMarker()
        llm.enqueue(
          {toolCalls: [{name: 'shell', arguments: {command: `sleep 30.${marker}`, timeout_seconds: 60}}]},
          {text: 'never'},
        )
        const crashed = inNamespace(['send', '--agent', 'a1', 'go'])
        const deadline = Date.now() + 30_000
        while (processesWith(marker).length === 0 && Date.now() < deadline) await sleep(25)
        expect(processesWith(marker).length).toBeGreaterThan(0)
        crashed.kill('SIGKILL')
        await crashed
        const settle = Date.now() + 3000
        while (processesWith(marker).length > 0 && Date.now() < settle) await sleep(25)
        const db = openGatewayDb(home.home)
        const rows = db.prepare('SELECT keeper_pid, cgroups FROM run_processes').all() as Array<{
          keeper_pid: number
          cgroups: string
        }>
        db.close()
        expect(rows).toHaveLength(1)
        // (whatever the reclaim leaves is cleaned up here for the machine)
        leftovers.push(...(JSON.parse(rows[0]!.cgroups) as string[]))
        // 2. the next send, in a fresh namespace of its own: its keeper gets the same pid
        llm.reset() // the crashed run never asked for its second turn
        llm.enqueue({text: 'hello'})
        const next = await inNamespace(['send', '--agent', 'a1', 'hi'])
        expect(next.stderr).toContain('killed what 1 run(s) of a process that is gone left running')
        expect(next.stdout.trim(), next.stderr).toBe('hello')
        expect(next.exitCode).toBe(0)
      },
    )

    it.runIf(has('mount'))(
      "a stale run's TMPDIR the reclaim cannot remove: send says so and answers, it does not crash",
      async () => {
        const {home, env, tmp} = setup()
        // what a crashed owner's run left: its TMPDIR holds something rmSync cannot remove (as root: a mount point;
        // for a non-root operator, a directory the agent made read-only: EACCES)
        const stale = fs.mkdtempSync(path.join(tmp, 'stale-'))
        fs.mkdirSync(path.join(stale, 'm'))
        execaSync('mount', ['-t', 'tmpfs', 'none', path.join(stale, 'm')])
        mounts.push(path.join(stale, 'm'))
        const db = openGatewayDb(home.home)
        db.prepare(
          `INSERT INTO run_processes (run_id, owner_pid, owner_start, keeper_pid, cgroups, container, tmp_dir, started_at) VALUES (?, ?, NULL, NULL, '[]', NULL, ?, ?)`,
        ).run(
          'run_stale',
          4_000_000, // above pid_max: a dead owner
          stale,
          Date.now(),
        )
        db.close()
        llm.enqueue({text: 'hello'})
        const result = await runCli(['send', '--agent', 'a1', 'hi'], {home: home.home, env})
        expect(result.stderr).not.toMatch(/^\s+at /m) // no raw stack trace of an unhandled rejection
        expect(result.stdout.trim(), result.stderr).toBe('hello')
        expect(result.exitCode).toBe(0)
        expect(result.stderr).toContain(`could not remove what an abandoned run left (remove it by hand): ${stale}`)
      },
    )
  },
)

describe.runIf(
  process.platform === 'linux' && root && fs.existsSync('/sys/fs/cgroup/freezer/cgroup.procs') && has('unshare'),
)('a keeper killed after it froze its run, before its SIGKILLs', {timeout: 60_000}, () => {
  it('a reclaim from another pid namespace (cgroup.procs looks empty there) does not let the run go on: frozen again within 50 ms, the record kept, the operator told', async () => {
    const dir = path.join('/sys/fs/cgroup/freezer', `meepa-test-frozen-${process.pid}`)
    fs.mkdirSync(dir)
    leftovers.push(dir)
    const home = fs.mkdtempSync(path.join(os.tmpdir(), 'meepa-frozen-'))
    dirs.push(home)
    const marker = uniqueMarker()
    // the agent's background process: it counts while it runs
    const ticks = path.join(home, 'ticks')
    const victim = execa('sh', ['-c', `while :; do echo x >> ${ticks}; sleep 0.05; done # ${marker}`], {
      detached: true,
      reject: false,
    })
    await until(() => processesWith(marker).length === 1)
    const [pid] = processesWith(marker)
    fs.writeFileSync(path.join(dir, 'cgroup.procs'), String(pid))
    // kill_run froze the run, and its keeper died before it sent the kills (the other case, kills
    // pending because the run's pid namespace died too, is the pid-namespace send above)
    fs.writeFileSync(path.join(dir, 'freezer.state'), 'FROZEN')
    await until(() => fs.readFileSync(path.join(dir, 'freezer.state'), 'utf8').startsWith('FROZEN'))
    const db = openGatewayDb(home)
    db.prepare(
      `INSERT INTO run_processes (run_id, owner_pid, owner_start, keeper_pid, cgroups, container, tmp_dir, started_at) VALUES ('run_frozen', 4000000, NULL, NULL, ?, NULL, NULL, ?)`,
    ).run(JSON.stringify([dir]), Date.now())
    db.close()
    // the next start-up's reclaim, in a pid namespace of its own
    const module = path.join(ROOT, 'dist', 'runtime', 'run-lifecycle', 'run-processes.js')
    const reclaim = await execa(
      'unshare',
      [
        '--pid',
        '--fork',
        '--mount-proc',
        process.execPath,
        '--input-type=module',
        '-e',
        `import {reapAbandonedRuns} from ${JSON.stringify(module)}; console.log(JSON.stringify(await reapAbandonedRuns(${JSON.stringify(home)})))`,
      ],
      {reject: false},
    )
    expect(reclaim.exitCode, reclaim.stderr).toBe(0)
    const result = JSON.parse(reclaim.stdout) as {runs: string[]; failures: string[]}
    // frozen again: FROZEN, or FREEZING for as long as a task waits in the kernel on a frozen one
    // (a shell's vfork parent while its child sits frozen): either way nothing of it runs
    await until(() => /^(FROZEN|FREEZING)/.test(fs.readFileSync(path.join(dir, 'freezer.state'), 'utf8')))
    await sleep(100)
    const before = fs.existsSync(ticks) ? fs.readFileSync(ticks, 'utf8').length : 0
    await sleep(500)
    expect(fs.existsSync(ticks) ? fs.readFileSync(ticks, 'utf8').length : 0).toBe(before) // nothing runs
    expect(result.runs).toEqual([])
    expect(result.failures).toEqual([expect.stringContaining(`${dir}: processes of run run_frozen are still in it`)])
    const rows = openGatewayDb(home).prepare('SELECT run_id FROM run_processes').all()
    expect(rows).toEqual([{run_id: 'run_frozen'}])
    // a start-up that can see them (this pid namespace) finishes the job
    const {reapAbandonedRuns} = await import('../../../src/runtime/run-lifecycle/run-processes.js')
    expect(await reapAbandonedRuns(home)).toMatchObject({runs: ['run_frozen'], failures: []})
    await until(() => processesWith(marker).length === 0)
    await victim
  })
})

describe.runIf(process.platform === 'linux' && fs.existsSync(HELPER))(
  'limits.disk checked while agent-run starts',
  {timeout: 60_000},
  () => {
    it('a workspace already over limits.disk: the started stand-in never gets its input, and the run is E_DISK "already uses"', async () => {
      const home = fs.mkdtempSync(path.join(os.tmpdir(), 'meepa-disk-before-'))
      dirs.push(home)
      const workspace = path.join(home, 'agents', 'a1')
      const tmpDir = path.join(home, 'tmp')
      fs.mkdirSync(workspace, {recursive: true})
      fs.mkdirSync(tmpDir)
      fs.writeFileSync(path.join(workspace, 'big'), Buffer.alloc(3 * 1024 * 1024, 1))
      // planted in the workspace: a FIFO and a symlink loop; the measure must neither block nor follow them
      execaSync('mkfifo', [path.join(workspace, 'fifo')])
      fs.symlinkSync('.', path.join(workspace, 'loop'))
      const runId = `run_disk${process.pid}`
      const agent = resolveAgent({id: 'a1', limits: {memory: '512m', pids: 256, cpus: 1, disk: '1m'}} as never, {})
      const input = {version: 1, run_id: runId, agent, message: {content: 'hi'}} as unknown as AgentRunInput
      const started = Date.now()
      const output = await runAgentProcess({
        argv: ['sh', '-c', `read line; echo "$line" > ${workspace}/got-input`],
        env: {PATH: process.env.PATH ?? '/usr/bin:/bin'},
        cwd: workspace,
        input,
        llm: {chat: () => Promise.reject(new Error('no LLM here')), maxCalls: 1},
        timeoutMs: 20_000,
        quietUntilInput: true,
        ownership: {home, runId, limits: agent.limits, workspace, tmpDir},
      })
      expect(output.ok).toBe(false)
      expect(!output.ok && output.error).toMatchObject({
        code: 'E_DISK',
        message: expect.stringContaining('already uses'),
      })
      expect(fs.existsSync(path.join(workspace, 'got-input'))).toBe(false)
      expect(Date.now() - started).toBeLessThan(5000)
    })
  },
)
