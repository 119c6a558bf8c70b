import {execa} from 'execa'
import fs from 'node:fs'
import path from 'node:path'
import {afterAll, beforeAll, expect, it} from 'vitest'
import {startFakeLlm, type FakeLlm} from '../../../fakes/llm-server.js'
import {freePort} from '../../../helpers/free-port.js'
import {BIN, fakeLlmConfig, makeHome, runCli, type TestHome} from '../../../helpers/home.js'
import {runShellWithStandby} from '../../../helpers/standby-message.js'
import type {RunMessageResult} from '../../../../src/runtime/runners/run-message.js'
import {stopStandbyContainers} from '../../../../src/runtime/runners/container/standby-pool.js'
import {homeLabel} from '../../../../src/sandbox/docker/home-label.js'
import {describeWithDocker, homeContainersArgs, runningStandby} from '../../../helpers/docker-env.js'

/*
 * Standby containers, on the path a running gateway takes (runMessage with `standby`): after a
 * run, the agent's next container starts at once and waits for its message. What must hold is
 * what a user relies on: the next message still gets a container nobody used before, the
 * agent's current config, and a deadline counted from the message, not from the container start.
 */

// Printed by the scripted command: the container (when its init started, in ticks since boot), how
// long its init has been up, /tmp, the memory limit.
const PROBE = `echo "container=$(awk '{print "init-started-at-tick-" $22}' /proc/1/stat) age=$(awk -v up="$(cut -d' ' -f1 /proc/uptime)" '{printf "%.2f", up - $22/100}' /proc/1/stat) tmp=[$(ls -A /tmp | tr '\\n' ' ')] limit=$(cat /sys/fs/cgroup/memory/memory.limit_in_bytes 2>/dev/null || cat /sys/fs/cgroup/memory.max)"; touch /tmp/left-by-previous-run`

describeWithDocker('container mode: standby containers of a running gateway (real engine)', () => {
  let llm: FakeLlm
  let home: TestHome
  const logs: string[] = []
  const agent = (containerMode: Record<string, unknown> = {}) => ({
    id: 'warm',
    container_mode: {enabled: true, network: 'host', memory_limit: '512m', timeout_seconds: 3, ...containerMode},
  })

  const send = async (command: string): Promise<{result: RunMessageResult; ms: number}> => {
    const started = Date.now()
    const result = await runShellWithStandby(llm, home, 'warm', command, (line) => logs.push(line))
    return {result, ms: Date.now() - started}
  }
  const probe = (result: RunMessageResult) => {
    if (!result.output.ok) throw new Error(`run failed: ${JSON.stringify(result.output.error)}`)
    const match = /container=(\S+) age=([\d.]+) tmp=\[([^\]]*)\] limit=(\S+)/.exec(result.output.reply.content)
    if (!match) throw new Error(`no probe output in: ${result.output.reply.content}`)
    return {host: match[1], age: Number(match[2]), tmp: (match[3] ?? '').trim(), limit: match[4]}
  }
  const containers = async (filter: string[] = []) =>
    (await execa('docker', homeContainersArgs(home.home, filter))).stdout.split('\n').filter(Boolean)
  const standbyReady = async () => {
    for (let i = 0; i < 150; i++) {
      if ((await containers(['--filter', 'label=meepagateway.run=standby', '--filter', 'status=running'])).length === 1)
        return
      await new Promise((resolve) => setTimeout(resolve, 200))
    }
    throw new Error('no standby container started within 30 s')
  }

  beforeAll(async () => {
    llm = await startFakeLlm()
    process.env.FAKE_LLM_KEY = 'sk-fake-test-key-123456'
    home = makeHome(fakeLlmConfig(llm.openaiBaseUrl, [agent()]))
  })
  afterAll(async () => {
    await stopStandbyContainers()
    await llm.close()
    home.cleanup()
  })

  it('the next message runs in a container started before it arrived, never used before, after a wait longer than its deadline', async () => {
    const first = probe((await send(PROBE)).result)
    await standbyReady()
    // Longer than timeout_seconds (3 s): the deadline must count from the message, not the start.
    await new Promise((resolve) => setTimeout(resolve, 4000))
    logs.length = 0
    const {result, ms} = await send(PROBE)
    const second = probe(result)
    expect(logs.join('\n')).toMatch(/running in standby container meepa-standby_/)
    expect(second.host).not.toBe(first.host)
    // its init had been up for most of the 4 s wait before the message was sent (age is read
    // mid-run; the margin covers the run's remaining turn on a loaded machine)
    expect(second.age).toBeGreaterThan(ms / 1000 + 2)
    // nothing of the previous run: the file it left in its /tmp is not here
    expect(second.tmp).not.toContain('left-by')
  }, 120_000)

  it('a standby past its message deadline is killed like any run: a timeout reply, no late side effect', async () => {
    await standbyReady()
    const {result} = await send('sleep 6; touch /workspace/LATE')
    expect(result.output.ok).toBe(false)
    expect(!result.output.ok && result.output.error.code).toBe('E_TIMEOUT')
    await new Promise((resolve) => setTimeout(resolve, 5000))
    expect(fs.existsSync(path.join(home.workspace('warm'), 'LATE'))).toBe(false)
  }, 120_000)

  it('after a config change the standby is discarded: the run gets the new limits in a fresh container', async () => {
    await standbyReady()
    const [stale] = await containers(['--filter', 'label=meepagateway.run=standby'])
    home.writeConfig(fakeLlmConfig(llm.openaiBaseUrl, [agent({memory_limit: '256m'})]))
    logs.length = 0
    const changed = probe((await send(PROBE)).result)
    expect(logs.join('\n')).not.toMatch(/standby container/)
    expect(Number(changed.limit)).toBe(256 * 1024 * 1024)
    expect(changed.age).toBeLessThan(30)
    for (let i = 0; i < 50 && (await containers()).includes(stale as string); i++)
      await new Promise((resolve) => setTimeout(resolve, 200))
    expect(await containers()).not.toContain(stale)
  }, 120_000)

  it('with container_mode.standby: false nothing waits between messages', async () => {
    await stopStandbyContainers()
    home.writeConfig(fakeLlmConfig(llm.openaiBaseUrl, [agent({standby: false})]))
    probe((await send(PROBE)).result)
    // the run's own container is removed after its answer; then nothing new may appear
    for (let i = 0; i < 150 && (await containers()).length > 0; i++)
      await new Promise((resolve) => setTimeout(resolve, 200))
    expect(await containers()).toEqual([])
    await new Promise((resolve) => setTimeout(resolve, 2000))
    expect(await containers()).toEqual([])
    home.writeConfig(fakeLlmConfig(llm.openaiBaseUrl, [agent()]))
    probe((await send(PROBE)).result)
  }, 120_000)

  it('stopping the standbys (gateway shutdown) leaves no container behind', async () => {
    await standbyReady()
    await stopStandbyContainers()
    expect(await containers()).toEqual([])
  }, 120_000)
})

describeWithDocker('`serve` with a container agent (real engine)', () => {
  it('answers the second message from a standby container, and leaves no container behind when it stops', async () => {
    const llm = await startFakeLlm()
    llm.setDefault({text: 'pong'})
    const port = await freePort()
    const home = makeHome(
      fakeLlmConfig(llm.openaiBaseUrl, [{id: 'boxed', container_mode: {enabled: true, network: 'host'}}], {
        captain: {enabled: true, bind: '127.0.0.1', port},
      }),
    )
    try {
      const {key} = JSON.parse((await runCli(['api-key', 'create', 'tests', '--json'], {home: home.home})).stdout)
      let output = ''
      const serve = execa(process.execPath, [BIN, 'serve'], {
        env: {MEEPAGATEWAY_HOME: home.home, FAKE_LLM_KEY: 'sk-fake-test-key-123456'},
        reject: false,
        timeout: 120_000,
      })
      serve.stderr?.on('data', (chunk) => (output += String(chunk)))
      serve.stdout?.on('data', (chunk) => (output += String(chunk)))
      for (let i = 0; i < 200 && !output.includes('listening on'); i++)
        await new Promise((resolve) => setTimeout(resolve, 100))
      const chat = async () => {
        const response = await fetch(`http://127.0.0.1:${port}/api/chat`, {
          method: 'POST',
          headers: {authorization: `Bearer ${key}`, 'content-type': 'application/json'},
          body: JSON.stringify({agent: 'boxed', message: 'ping'}),
        })
        expect(response.status).toBe(200)
        return ((await response.json()) as {reply: string}).reply
      }
      const containers = async () =>
        (
          await execa('docker', ['ps', '-a', '-q', '--filter', `label=meepagateway.home=${homeLabel(home.home)}`])
        ).stdout
          .split('\n')
          .filter(Boolean)

      expect(await chat()).toBe('pong')
      expect(await runningStandby(home.home)).not.toBe('')
      expect(await chat()).toBe('pong')
      expect(output).toMatch(/running in standby container meepa-standby_/)

      serve.kill('SIGTERM')
      expect((await serve).exitCode).toBe(0)
      expect(await containers()).toEqual([])
    } finally {
      await llm.close()
      home.cleanup()
    }
  }, 180_000)
})
