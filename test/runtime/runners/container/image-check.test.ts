import {execa} from 'execa'
import crypto from 'node:crypto'
import {afterAll, afterEach, beforeAll, expect, it, vi} from 'vitest'
import {loadConfig} from '../../../../src/runtime/config/load.js'
import {containerImageContext} from '../../../../src/runtime/container/context.js'
import {readyIsolationImage} from '../../../../src/runtime/runners/container/runner.js'
import {dockerCli, type DockerExec} from '../../../../src/sandbox/docker/cli.js'
import {fakeLlmConfig, makeHome, type TestHome} from '../../../helpers/home.js'
import {BASE_IMAGE, describeWithDocker} from '../../../helpers/docker-env.js'

/*
 * A container message checks its isolation image (a few docker calls) at most every 30 s; chat
 * messages minutes apart then run on the image checked last while the check runs behind them, and
 * only past 10 minutes does a message wait for it.
 */
describeWithDocker('the isolation image check before a container message', () => {
  let home: TestHome
  const calls: string[][] = []
  const counting: DockerExec = {exec: (args, options) => (calls.push([...args]), dockerCli().exec(args, options))}
  const base = `meepa-test-check-base-${crypto.randomBytes(4).toString('hex')}`
  const buildBase = (version: number) =>
    execa('docker', ['build', '-q', '-t', base, '-'], {
      input: `FROM ${BASE_IMAGE}\nLABEL meepa-test-version=${version}\n`,
    })
  const ready = (agentId = 'boxed') => {
    const loaded = loadConfig({configPath: home.configPath, home: home.home})
    const agent = loaded.config.agents.find((each) => each.id === agentId)!
    return readyIsolationImage(loaded.config, agent, {...containerImageContext(home.home), cli: counting})
  }
  /** Calls made until `promise` settled, and its value. */
  const callsUntil = async <T>(promise: Promise<T>) => {
    const before = calls.length
    const value = await promise
    return {value, calls: calls.length - before}
  }
  const later = (ms: number) => {
    const now = Date.now()
    vi.spyOn(Date, 'now').mockReturnValue(now + ms)
  }

  const made: string[] = []
  beforeAll(async () => {
    await buildBase(1)
    home = makeHome(
      fakeLlmConfig('http://127.0.0.1:9/v1', [
        {id: 'boxed', container_mode: {enabled: true, network: 'none'}},
        {id: 'custom', container_mode: {enabled: true, network: 'none', image: base}},
      ]),
    )
  })
  afterEach(() => vi.restoreAllMocks())
  afterAll(async () => {
    await execa('docker', ['image', 'rm', '--force', ...made, base], {reject: false})
    home.cleanup()
  })

  it('checks once, then trusts the check for 30 s, then checks behind the message, and past 10 minutes before it', async () => {
    const first = await callsUntil(ready())
    expect(first.calls).toBeGreaterThan(0)
    expect(first.value.id).toMatch(/^sha256:/)

    const within = await callsUntil(ready())
    expect(within).toEqual({value: first.value, calls: 0})

    // a message 5 minutes later: the image checked last, no docker call before it runs
    later(5 * 60_000)
    const stale = await callsUntil(ready())
    expect(stale).toEqual({value: first.value, calls: 0})
    // ... and the check behind it, whose result the next message uses without a call
    await vi.waitFor(() => expect(calls.length).toBeGreaterThan(first.calls), {timeout: 30_000})
    await new Promise((resolve) => setTimeout(resolve, 500))
    expect(await callsUntil(ready())).toEqual({value: first.value, calls: 0})

    // a message 11 minutes after the last check waits for a new one
    vi.restoreAllMocks()
    later(16 * 60_000)
    const old = await callsUntil(ready())
    expect(old.calls).toBeGreaterThan(0)
    expect(old.value).toEqual(first.value)
  }, 600_000)

  it('a check behind a message that rebuilds the image leaves the one it replaced for the messages handed it', async () => {
    const first = await ready('custom')
    made.push(first.id)
    await buildBase(2) // the agent's base changed: the next check rebuilds its isolation image
    later(5 * 60_000)
    const handed = await ready('custom')
    expect(handed).toEqual(first)
    await vi.waitFor(async () => expect((await ready('custom')).id).not.toBe(first.id), {
      timeout: 300_000,
      interval: 500,
    })
    const rebuilt = await ready('custom')
    made.push(rebuilt.id)
    // the message handed the old image can still start from it
    const inspected = await execa('docker', ['image', 'inspect', '--format', '{{.Id}}', handed.id], {reject: false})
    expect(inspected.stdout.trim(), inspected.stderr).toBe(handed.id)
  }, 600_000)
})
