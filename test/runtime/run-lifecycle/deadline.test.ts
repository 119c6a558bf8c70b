import Database from 'better-sqlite3'
import {execa} from 'execa'
import fs from 'node:fs'
import os from 'node:os'
import path from 'node:path'
import {afterEach, describe, expect, it} from 'vitest'
import type {FakeLlm} from '../../fakes/llm-server.js'
import {fakeLlmForTests} from '../../helpers/fake-llm-for-tests.js'
import {freePort} from '../../helpers/free-port.js'
import {fakeLlmConfig, makeHome, ROOT, type TestHome} from '../../helpers/home.js'
import {processesWith, uniqueMarker} from '../../helpers/processes.js'
import {startServe, type ServeProcess} from '../../helpers/serve.js'
import {waitFor} from '../../helpers/wait-for.js'
import {HELPER, requireLandlockOrSkip} from '../../helpers/landlock-support.js'
import {successfulOutput} from '../../helpers/agent-run-output.js'

/*
 * Issue 28, criterion 6: no run outlives what its user was told. The keeper ends a run at its
 * deadline on its own, while `serve` is stopped (SIGSTOP); "took too long" is said only of a
 * deadline that passed while the gateway ran; a keeper killed from outside is recorded as such.
 * Faults are injected into the real serve from bin/run.js.
 */

let llm: FakeLlm
fakeLlmForTests((started) => (llm = started), {resetBeforeEach: true})

const homes: TestHome[] = []
const serves: ServeProcess[] = []
afterEach(async () => {
  for (const serve of serves.splice(0)) {
    if (serve.process.exitCode === null) {
      serve.process.kill('SIGCONT')
      await serve.stop()
    }
  }
  for (const home of homes.splice(0)) home.cleanup()
})

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms))

function record(
  home: TestHome,
  runId: string,
): {status: string; error_code: string; error_message: string} | undefined {
  const db = new Database(path.join(home.home, 'gateway.db'), {readonly: true})
  try {
    return db.prepare('SELECT status, error_code, error_message FROM runs WHERE id = ?').get(runId) as never
  } finally {
    db.close()
  }
}

const runIdOf = (reply: string) => /\(ref (run_[0-9a-f]+)\)/.exec(reply)?.[1] as string

const levels = [
  {level: 'unrestricted', agent: {file_access: {unrestricted: true}}},
  ...(requireLandlockOrSkip('deadlines at the host-sandbox level') ? [{level: 'host-sandbox', agent: {}}] : []),
]

/** serve on a fresh home with agent a1 (`timeout_seconds`), its run scripted to run `command` in its shell. */
async function serveRunning(
  agent: Record<string, unknown>,
  timeoutSeconds: number,
  command: string,
): Promise<{home: TestHome; serve: ServeProcess; chat: Promise<{status: number; reply: string}>}> {
  const port = await freePort()
  const home = makeHome(
    fakeLlmConfig(llm.openaiBaseUrl, [{id: 'a1', timeout_seconds: timeoutSeconds, ...agent}], {
      captain: {enabled: true, bind: '127.0.0.1', port},
    }),
  )
  homes.push(home)
  const serve = await startServe({home: home.home, port})
  serves.push(serve)
  llm.enqueue({toolCalls: [{name: 'shell', arguments: {command, timeout_seconds: 60}}]}, {text: 'finished'})
  return {home, serve, chat: serve.chat('a1', 'go')}
}

/** The keeper of the run whose process holds `marker`: the nearest `meepa-sandbox --keeper-fd` above it. */
function keeperOf(marker: string): number | undefined {
  for (let pid = processesWith(marker)[0]; pid && pid > 1;) {
    const cmdline = fs.readFileSync(`/proc/${pid}/cmdline`, 'utf8').split('\0')
    if (cmdline[0] === HELPER && cmdline[1] === '--keeper-fd') return pid
    const stat = fs.readFileSync(`/proc/${pid}/stat`, 'utf8')
    pid = Number(stat.slice(stat.lastIndexOf(')') + 2).split(' ')[1])
  }
  return undefined
}

describe.runIf(process.platform === 'linux' && fs.existsSync(HELPER))(
  "a run's deadline holds whatever becomes of the gateway",
  {timeout: 90_000},
  () => {
    for (const {level, agent} of levels) {
      it(`serve stopped (SIGSTOP) past a run's deadline (${level}): the command is killed at the deadline, and the user is not told it took too long`, async () => {
        const marker = uniqueMarker()
        const {home, serve, chat} = await serveRunning(agent, 3, `sleep 6.${marker}; touch AFTER_DEADLINE`)
        await waitFor("the run's command", () => processesWith(marker).length > 0, 20_000)
        const stoppedAt = Date.now()
        serve.process.kill('SIGSTOP')
        // the deadline is 3 s from the message: the keeper ends the command then, serve still stopped
        await waitFor('the command to be killed while serve is stopped', () => processesWith(marker).length === 0, 6000)
        expect(Date.now() - stoppedAt).toBeLessThan(4000)
        await sleep(7000 - (Date.now() - stoppedAt)) // past the moment the command would have written
        expect(fs.existsSync(path.join(home.workspace('a1'), 'AFTER_DEADLINE'))).toBe(false)
        serve.process.kill('SIGCONT')
        const {reply} = await chat
        expect(reply).toMatch(/^Sorry, I was paused when this message's time ran out/)
        expect(reply).not.toMatch(/too long/)
        const failed = record(home, runIdOf(reply))
        expect(failed).toMatchObject({status: 'failed', error_code: 'E_TIMEOUT'})
        expect(failed?.error_message).toMatch(
          /the gateway was stopped \(suspended\) when the run's 3 s deadline passed/,
        )
        expect(failed?.error_message).not.toMatch(/took longer/)
      })
    }

    it('a keeper killed from outside: the run ends, and its record says the keeper was killed', async () => {
      const marker = uniqueMarker()
      const {home, chat} = await serveRunning({file_access: {unrestricted: true}}, 60, `sleep 30.${marker}`)
      await waitFor("the run's command", () => processesWith(marker).length > 0, 20_000)
      const keeper = keeperOf(marker)
      expect(keeper).toBeDefined()
      process.kill(keeper as number, 'SIGKILL')
      const {reply} = await chat
      const failed = record(home, runIdOf(reply))
      expect(failed).toMatchObject({status: 'failed', error_code: 'E_RUN'})
      expect(failed?.error_message).toBe(
        `the run's keeper (process ${keeper}) was killed by SIGKILL from outside the gateway, and its run ended with it`,
      )
      await waitFor('every process of the run to be gone', () => processesWith(marker).length === 0, 5000)
    })
  },
)

/**
 * The runner on its own, in a process of the test's (the owner), stopped while its agent-run (a
 * stand-in that answers after 1.5 s) answers, and resumed past the deadline.
 */
describe.runIf(process.platform === 'linux')(
  'an answer that came while the gateway was stopped',
  {timeout: 60_000},
  () => {
    it('is delivered, not reported as having taken too long', async () => {
      const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'deadline-'))
      const agentRun = path.join(dir, 'agent-run.mjs')
      const output = successfulOutput('run_paused', 'on time')
      fs.writeFileSync(
        agentRun,
        `
      import fs from 'node:fs'
      process.stdin.once('data', () => {
        fs.writeFileSync(${JSON.stringify(path.join(dir, 'has-input'))}, '')
        setTimeout(() => process.stdout.write(${JSON.stringify(JSON.stringify({type: 'result', output}) + '\n')}, () => process.exit(0)), 1500)
      })
    `,
      )
      const owner = path.join(dir, 'owner.mjs')
      fs.writeFileSync(
        owner,
        `
      import {runAgentProcess} from ${JSON.stringify(path.join(ROOT, 'dist/runtime/run-lifecycle/agent-run-process.js'))}
      const output = await runAgentProcess({
        argv: [process.execPath, ${JSON.stringify(agentRun)}], env: {PATH: process.env.PATH}, cwd: ${JSON.stringify(dir)},
        ownership: {home: ${JSON.stringify(dir)}, runId: 'run_paused', limits: {memory: '512m', pids: 256, cpus: 1, disk: '1g'}, workspace: ${JSON.stringify(dir)}, tmpDir: ${JSON.stringify(dir)}},
        input: {version: 1, run_id: 'run_paused'},
        llm: {chat: async () => { throw new Error('no LLM here') }, maxCalls: 1},
        timeoutMs: 3000,
      })
      process.stdout.write(JSON.stringify(output))
    `,
      )
      const child = execa(process.execPath, [owner], {reject: false})
      await waitFor('the stand-in to have its input', () => fs.existsSync(path.join(dir, 'has-input')))
      child.kill('SIGSTOP')
      await sleep(4500) // the answer comes at 1.5 s, the deadline passes at 3 s
      child.kill('SIGCONT')
      const result = await child
      expect(JSON.parse(String(result.stdout))).toMatchObject({ok: true, reply: {content: 'on time'}})
      fs.rmSync(dir, {recursive: true, force: true})
    })
  },
)
