import {execa} from 'execa'
import fs from 'node:fs'
import os from 'node:os'
import path from 'node:path'
import type {Readable} from 'node:stream'
import {afterEach, describe, expect, it} from 'vitest'
import type {AgentRunInput} from '../../../src/runtime/shapes/agent-run-contract.js'
import {resolveAgent} from '../../../src/runtime/config/load.js'
import {runAgentProcess} from '../../../src/runtime/run-lifecycle/agent-run-process.js'
import {
  cgroupSupport,
  createRunCgroup,
  killRunCgroups,
  removeRunCgroups,
  type RunCgroup,
} from '../../../src/sandbox/run-cgroup.js'
import {keeperJoined} from '../../../src/sandbox/keeper.js'
import {HELPER} from '../../helpers/landlock-support.js'

/*
 * A cgroup v1 migration waits for an RCU grace period (5-15 ms), so the keeper may move a run
 * that starts nothing before its input (agent-run) into its cgroups while it starts
 * (--join-while-starting), and the owner holds the input back until the keeper says 'J'.
 * Attacked here: a run that reads its input at once must find itself in its cgroups, and a
 * cgroup the keeper cannot join must stop the run before it does anything.
 */

const cgroups = cgroupSupport()
const made: RunCgroup[] = []
const dirs: string[] = []
afterEach(() => {
  for (const cgroup of made.splice(0)) {
    killRunCgroups(cgroup.dirs)
    removeRunCgroups(cgroup.dirs)
  }
  for (const dir of dirs.splice(0)) fs.rmSync(dir, {recursive: true, force: true})
})

const scratch = () => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'meepa-join-'))
  dirs.push(dir)
  return dir
}

/** The lines of /proc/PID/cgroup that the run's limits need: memory and pids (v1), the unified one (v2). */
const limitLines = (text: string) =>
  text.split('\n').filter((line) => (cgroups.mode === 'v2' ? /^0::/ : /^\d+:(memory|pids):/).test(line))

describe.runIf(process.platform === 'linux' && fs.existsSync(HELPER) && cgroups.mode !== 'none')(
  'joining the run cgroups while agent-run starts',
  {timeout: 30_000},
  () => {
    it("the keeper says 'J' once the command is in every cgroup of the run; input held back until then finds it there", async () => {
      const cgroup = createRunCgroup(`run_join${process.pid}`, {memoryBytes: 256 * 1024 * 1024, pids: 64, cpus: 1})!
      made.push(cgroup)
      const flags = cgroup.dirs.flatMap((dir) => ['--cgroup', dir])
      // reads its input, then says where it is: started before the join, it would be outside without the wait
      const child = execa(
        HELPER,
        [
          '--keeper-fd',
          '3',
          ...flags,
          '--join-while-starting',
          '--',
          'sh',
          '-c',
          'read line; echo "$line"; cat /proc/self/cgroup',
        ],
        {
          stdio: ['pipe', 'pipe', 'pipe', 'pipe'],
          reject: false,
          detached: true,
        },
      )
      expect(await keeperJoined(child.stdio[3] as Readable)).toBe(true)
      child.stdin?.end('the input\n')
      const result = await child
      expect(result.exitCode).toBe(0)
      const [echoed, ...rest] = result.stdout.split('\n')
      expect(echoed).toBe('the input')
      const lines = limitLines(rest.join('\n'))
      expect(lines).toHaveLength(cgroups.mode === 'v2' ? 1 : 2)
      for (const line of lines) expect(line).toMatch(new RegExp(`/run_join${process.pid}$`))
    })

    it('a cgroup the keeper cannot join: the command is killed before it does anything, no J, exit 125 naming the cgroup', async () => {
      const dir = scratch()
      const missing = path.join('/sys/fs/cgroup', `meepa-missing-${process.pid}`)
      const child = execa(
        HELPER,
        [
          '--keeper-fd',
          '3',
          '--cgroup',
          missing,
          '--join-while-starting',
          '--',
          'sh',
          '-c',
          `sleep 0.5; touch ${dir}/ran`,
        ],
        {
          stdio: ['pipe', 'pipe', 'pipe', 'pipe'],
          reject: false,
          detached: true,
        },
      )
      const joined = keeperJoined(child.stdio[3] as Readable)
      const result = await child
      expect(await joined).toBe(false)
      expect(result.exitCode).toBe(125)
      expect(result.stderr).toContain(`cannot join the run's cgroup ${missing}`)
      await new Promise((resolve) => setTimeout(resolve, 800))
      expect(fs.existsSync(path.join(dir, 'ran'))).toBe(false)
    })

    it('runAgentProcess with quietUntilInput: a stand-in agent-run reading its input at once is already in the run cgroups', async () => {
      const home = scratch()
      const workspace = path.join(home, 'agents', 'a1')
      const tmpDir = path.join(home, 'tmp')
      fs.mkdirSync(workspace, {recursive: true})
      fs.mkdirSync(tmpDir)
      const runId = `run_quiet${process.pid}`
      const lines: string[] = []
      const input = {
        version: 1,
        run_id: runId,
        agent: resolveAgent({id: 'a1'}, {}),
        message: {content: 'hi'},
      } as unknown as AgentRunInput
      const output = await runAgentProcess({
        // stands in for agent-run: reads the input line, then prints its cgroups on stderr (no result
        // frame: the run fails, as it should)
        argv: ['sh', '-c', 'read line; cat /proc/self/cgroup >&2'],
        env: {PATH: process.env.PATH ?? '/usr/bin:/bin'},
        cwd: workspace,
        input,
        llm: {chat: () => Promise.reject(new Error('no LLM here')), maxCalls: 1},
        timeoutMs: 20_000,
        onStderr: (line) => lines.push(line),
        quietUntilInput: true,
        ownership: {home, runId, limits: resolveAgent({id: 'a1'}, {}).limits, workspace, tmpDir},
      })
      expect(output.ok).toBe(false)
      const listed = limitLines(lines.join('\n'))
      expect(listed, lines.join('\n')).toHaveLength(cgroups.mode === 'v2' ? 1 : 2)
      for (const line of listed) expect(line).toMatch(new RegExp(`/${runId}$`))
    })
  },
)
