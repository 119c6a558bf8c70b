import {execa, type ResultPromise} from 'execa'
import fs from 'node:fs'
import os from 'node:os'
import path from 'node:path'
import {afterEach, describe, expect, it} from 'vitest'
import type {FakeLlm} from '../../fakes/llm-server.js'
import {fakeLlmForTests} from '../../helpers/fake-llm-for-tests.js'
import {freePort} from '../../helpers/free-port.js'
import {BIN, fakeLlmConfig, makeHome, runCli, type TestHome} from '../../helpers/home.js'
import {processesWith, uniqueMarker} from '../../helpers/processes.js'
import {requireLandlockOrSkip} from '../../helpers/landlock-support.js'
import {openGatewayDb} from '../../../src/runtime/state/gateway-db.js'
import {processStartTime} from '../../../src/runtime/run-lifecycle/run-processes.js'
import {homeLabel} from '../../../src/sandbox/docker/home-label.js'
import {describeWithDocker} from '../../helpers/docker-env.js'

/*
 * Issue 14, criterion 1: whatever ends the process that started a run, every process of the run
 * is gone within 2 s and nothing it started writes afterwards. Driven through the built CLI.
 */

let llm: FakeLlm
fakeLlmForTests((started) => (llm = started), {resetBeforeEach: true})

const homes: TestHome[] = []
const owners: ResultPromise[] = []
afterEach(async () => {
  for (const owner of owners.splice(0)) {
    if (owner.exitCode === null) owner.kill('SIGKILL')
    await owner.catch(() => {})
  }
  for (const home of homes.splice(0)) home.cleanup()
})

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms))

async function waitFor(what: string, check: () => boolean, timeoutMs = 20_000): Promise<void> {
  const deadline = Date.now() + timeoutMs
  while (!check()) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`)
    await sleep(25)
  }
}

/** A run that forks a late writer, a writer in a session of its own (where allowed) and a long sleep. */
function scriptLongRun(marker: string): void {
  const command = `(sleep 2.${marker}1; echo late > LATE) & (setsid sh -c 'sleep 2.${marker}2; echo late > LATE2' 2>/dev/null &) ; sleep 30.${marker}3`
  llm.enqueue(
    {toolCalls: [{name: 'shell', arguments: {command, timeout_seconds: 60}}]},
    {text: 'finished (should never be seen)'},
  )
}

/** Kills the owner once the run's command runs; returns ms until the last of the run's processes was gone. */
async function killOwnerMidRun(owner: ResultPromise, marker: string, signal: NodeJS.Signals): Promise<number> {
  let output = ''
  owner.stderr?.on('data', (chunk) => (output += String(chunk)))
  owner.stdout?.on('data', (chunk) => (output += String(chunk)))
  await waitFor(`the run's command (${marker})`, () => processesWith(marker).length >= 2).catch(
    async (error: Error) => {
      throw new Error(
        `${error.message}; the owner said:\n${output}\n${process.env.DEBUG_TREE ? (await execa('ps', ['-eo', 'pid,ppid,sid,stat,cmd', '--forest'])).stdout : ''}`,
      )
    },
  )
  await sleep(200) // every part of the command is started
  owner.kill(signal)
  const killedAt = Date.now()
  await waitFor('every process of the run to be gone', () => processesWith(marker).length === 0, 10_000)
  return Date.now() - killedAt
}

const levels = [
  {level: 'unrestricted', agent: {id: 'a1', file_access: {unrestricted: true}}},
  ...(requireLandlockOrSkip('run ownership at the host-sandbox level')
    ? [{level: 'host-sandbox', agent: {id: 'a1'}}]
    : []),
]

async function startServe(home: TestHome): Promise<{url: string; serve: ResultPromise; output: () => string}> {
  let output = ''
  const serve = execa(process.execPath, [BIN, 'serve', '--config', home.configPath], {
    env: {MEEPAGATEWAY_HOME: home.home, FAKE_LLM_KEY: 'sk-fake-test-key-123456'},
    reject: false,
    timeout: 90_000,
  })
  owners.push(serve)
  serve.stdout?.on('data', (chunk) => (output += String(chunk)))
  serve.stderr?.on('data', (chunk) => (output += String(chunk)))
  await waitFor(
    `serve to listen:\n${output}`,
    () => /listening on (http:\/\/\S+)/.test(output) || serve.exitCode !== null,
  )
  const url = /listening on (http:\/\/\S+)/.exec(output)?.[1]
  if (!url) throw new Error(`serve did not start:\n${output}`)
  return {url, serve, output: () => output}
}

/** A gateway on a fresh home with `agent` (id a1), and a web chat message to it that runs `scriptLongRun`. */
async function serveLongRun(
  agent: Record<string, unknown>,
  extra: Record<string, unknown> = {},
): Promise<{home: TestHome; serve: ResultPromise; marker: string}> {
  const port = await freePort()
  const home = makeHome(
    fakeLlmConfig(llm.openaiBaseUrl, [agent], {captain: {enabled: true, bind: '127.0.0.1', port}, ...extra}),
  )
  homes.push(home)
  const key = JSON.parse((await runCli(['api-key', 'create', 'tests', '--json'], {home: home.home})).stdout).key
  const {url, serve} = await startServe(home)
  const marker = uniqueMarker()
  scriptLongRun(marker)
  const headers = {authorization: `Bearer ${key}`, 'content-type': 'application/json'}
  void fetch(`${url}/api/chat`, {method: 'POST', headers, body: JSON.stringify({agent: 'a1', message: 'go'})}).catch(
    () => {},
  )
  return {home, serve, marker}
}

describe.runIf(process.platform === 'linux')('no run outlives its owner', {timeout: 120_000}, () => {
  for (const {level, agent} of levels) {
    it(`SIGKILL of serve mid-run (${level}): every process of the run is gone within 2 s and nothing writes later`, async () => {
      const {home, serve, marker} = await serveLongRun(agent)
      const goneMs = await killOwnerMidRun(serve, marker, 'SIGKILL')
      expect(goneMs).toBeLessThan(2000)
      await sleep(2500) // past the moment the late writers would have written
      expect(fs.existsSync(path.join(home.workspace('a1'), 'LATE'))).toBe(false)
      expect(fs.existsSync(path.join(home.workspace('a1'), 'LATE2'))).toBe(false)
      // the keeper removed the run's cgroups too; the owner could not forget the run's record
      const db = openGatewayDb(home.home)
      const rows = db.prepare('SELECT cgroups FROM run_processes').all() as Array<{cgroups: string}>
      db.close()
      expect(rows).toHaveLength(1)
      for (const dir of JSON.parse(rows[0]!.cgroups) as string[]) expect(fs.existsSync(dir)).toBe(false)
      // the next start-up finds nothing of the run left to reclaim, and its record is interrupted
      const restarted = await startServe(home)
      const [record] = JSON.parse((await runCli(['runs', '--json'], {home: home.home})).stdout)
      expect(record).toMatchObject({status: 'interrupted'})
      const after = openGatewayDb(home.home)
      expect(after.prepare('SELECT run_id FROM run_processes').all()).toEqual([])
      after.close()
      restarted.serve.kill('SIGTERM')
      await restarted.serve
    })
  }

  for (const {level, agent} of levels) {
    it.each([
      ['SIGTERM', 143],
      ['SIGINT', 130],
    ] as const)(
      `%s to send (${level}) is forwarded to the run: send exits %i, and nothing of the run is left or writes later`,
      async (signal, exitCode) => {
        const home = makeHome(fakeLlmConfig(llm.openaiBaseUrl, [agent]))
        homes.push(home)
        const marker = uniqueMarker()
        scriptLongRun(marker)
        const send = execa(process.execPath, [BIN, 'send', '--agent', 'a1', 'go'], {
          env: {MEEPAGATEWAY_HOME: home.home, FAKE_LLM_KEY: 'sk-fake-test-key-123456'},
          reject: false,
          timeout: 60_000,
        })
        owners.push(send)
        const goneMs = await killOwnerMidRun(send, marker, signal)
        const result = await send
        expect(result.exitCode).toBe(exitCode)
        expect(result.stderr).toContain(`the run was cancelled (${signal})`)
        expect(goneMs).toBeLessThan(2000)
        await sleep(2500)
        expect(fs.existsSync(path.join(home.workspace('a1'), 'LATE'))).toBe(false)
        expect(fs.existsSync(path.join(home.workspace('a1'), 'LATE2'))).toBe(false)
      },
    )
  }

  it('SIGKILL of send mid-run: the keeper kills the run', async () => {
    const home = makeHome(fakeLlmConfig(llm.openaiBaseUrl, [levels.at(-1)!.agent]))
    homes.push(home)
    const marker = uniqueMarker()
    scriptLongRun(marker)
    const send = execa(process.execPath, [BIN, 'send', '--agent', 'a1', 'go'], {
      env: {MEEPAGATEWAY_HOME: home.home, FAKE_LLM_KEY: 'sk-fake-test-key-123456'},
      reject: false,
    })
    owners.push(send)
    const runDirs = () => fs.readdirSync(os.tmpdir()).filter((name) => name.startsWith(`meepa-run-${send.pid}-`))
    await waitFor('the run directory', () => runDirs().length === 1)
    expect(await killOwnerMidRun(send, marker, 'SIGKILL')).toBeLessThan(2000)
    await sleep(2500)
    expect(fs.existsSync(path.join(home.workspace('a1'), 'LATE'))).toBe(false)
    expect(runDirs()).toEqual([]) // the keeper removed the run's TMPDIR too
  })

  it('start-up kills what a dead owner left (keeper gone too) and removes stale run directories', async () => {
    const home = makeHome(fakeLlmConfig(llm.openaiBaseUrl, [{id: 'a1', file_access: {unrestricted: true}}]))
    homes.push(home)
    // a process that died: its pid, now free (a short-lived child of ours)
    const dead = await execa('sh', ['-c', 'echo $$'])
    const deadPid = Number(dead.stdout)
    const staleDir = fs.mkdtempSync(path.join(os.tmpdir(), `meepa-run-${deadPid}-run_stale-`))
    fs.writeFileSync(path.join(staleDir, 'left'), 'x')
    const liveDir = fs.mkdtempSync(path.join(os.tmpdir(), `meepa-run-${process.pid}-run_live-`))
    // a run of that dead owner still going, its keeper gone: a process in the run's recorded cgroup
    const marker = uniqueMarker()
    const cgroup = fs.existsSync('/sys/fs/cgroup/pids/cgroup.procs')
      ? path.join('/sys/fs/cgroup/pids', `meepa-test-${marker}`)
      : undefined
    const orphan = execa('sh', ['-c', `exec sleep 40.${marker}`], {detached: true, reject: false})
    owners.push(orphan)
    await waitFor('the orphan', () => processesWith(marker).length === 1)
    if (cgroup) {
      fs.mkdirSync(cgroup)
      fs.writeFileSync(path.join(cgroup, 'cgroup.procs'), String(processesWith(marker)[0]))
    }
    const db = openGatewayDb(home.home)
    db.prepare(
      `INSERT INTO run_processes (run_id, owner_pid, owner_start, keeper_pid, cgroups, container, tmp_dir, started_at) VALUES (?, ?, ?, NULL, ?, NULL, ?, ?)`,
    ).run(
      'run_stale',
      deadPid,
      processStartTime(process.pid),
      JSON.stringify(cgroup ? [cgroup] : []),
      staleDir,
      Date.now(),
    )
    db.close()

    llm.enqueue({text: 'hello'})
    const result = await runCli(['send', '--agent', 'a1', 'hi'], {home: home.home})
    expect(result.exitCode).toBe(0)
    expect(result.stderr).toContain('killed what 1 run(s) of a process that is gone left running: run_stale')
    expect(fs.existsSync(staleDir)).toBe(false)
    expect(fs.existsSync(liveDir)).toBe(true) // its owner (this test) is alive
    fs.rmSync(liveDir, {recursive: true})
    if (cgroup) {
      await waitFor('the orphan to be killed', () => processesWith(marker).length === 0, 3000)
      expect(fs.existsSync(cgroup)).toBe(false)
    } else {
      orphan.kill('SIGKILL')
    }
    const after = openGatewayDb(home.home)
    expect(after.prepare('SELECT run_id FROM run_processes').all()).toEqual([])
    after.close()
  })
})

describeWithDocker('no container run outlives its owner (real engine)', () => {
  it(
    'SIGKILL of serve mid-run (container): the keeper removes the container, its processes are gone and nothing writes later',
    {timeout: 400_000},
    async () => {
      const agent = {id: 'a1', container_mode: {enabled: true, network: 'host', timeout_seconds: 120, standby: false}}
      const {home, serve, marker} = await serveLongRun(agent, {image_config: {inject_credentials_env: false}})
      const containers = async () =>
        (
          await execa('docker', ['ps', '-a', '-q', '--filter', `label=meepagateway.home=${homeLabel(home.home)}`])
        ).stdout
          .split('\n')
          .filter(Boolean)
      await waitFor(`the run's command (${marker})`, () => processesWith(marker).length >= 2, 300_000)
      expect(await containers()).toHaveLength(1)
      await sleep(200)
      serve.kill('SIGKILL')
      const killedAt = Date.now()
      await waitFor('every process of the run to be gone', () => processesWith(marker).length === 0, 10_000)
      expect(Date.now() - killedAt).toBeLessThan(2000)
      const deadline = Date.now() + 10_000
      while ((await containers()).length > 0 && Date.now() < deadline) await sleep(100)
      expect(await containers()).toEqual([])
      await sleep(2500)
      expect(fs.existsSync(path.join(home.workspace('a1'), 'LATE'))).toBe(false)
    },
  )

  it(
    'SIGTERM to send (container): the container is killed, send exits 143, nothing writes later',
    {timeout: 400_000},
    async () => {
      const agent = {id: 'a1', container_mode: {enabled: true, network: 'host', timeout_seconds: 120}}
      const home = makeHome(fakeLlmConfig(llm.openaiBaseUrl, [agent], {image_config: {inject_credentials_env: false}}))
      homes.push(home)
      const marker = uniqueMarker()
      scriptLongRun(marker)
      const send = execa(process.execPath, [BIN, 'send', '--agent', 'a1', 'go'], {
        env: {MEEPAGATEWAY_HOME: home.home, FAKE_LLM_KEY: 'sk-fake-test-key-123456'},
        reject: false,
        timeout: 300_000,
      })
      owners.push(send)
      await waitFor(`the run's command (${marker})`, () => processesWith(marker).length >= 2, 300_000)
      await sleep(200)
      send.kill('SIGTERM')
      const killedAt = Date.now()
      await waitFor('every process of the run to be gone', () => processesWith(marker).length === 0, 10_000)
      expect(Date.now() - killedAt).toBeLessThan(2000)
      const result = await send
      expect(result.exitCode).toBe(143)
      expect(result.stderr).toContain('cancelled')
      await sleep(2500)
      expect(fs.existsSync(path.join(home.workspace('a1'), 'LATE'))).toBe(false)
      expect(
        (await execa('docker', ['ps', '-a', '-q', '--filter', `label=meepagateway.home=${homeLabel(home.home)}`]))
          .stdout,
      ).toBe('')
    },
  )
})
