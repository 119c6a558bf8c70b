import fs from 'node:fs'
import os from 'node:os'
import path from 'node:path'
import {afterEach, describe, expect, it} from 'vitest'
import YAML from 'yaml'
import {lockGatewayHome} from '../../../src/runtime/gateway/home-lock.js'
import {GatewayError} from '../../../src/runtime/util/errors.js'
import type {FakeLlm} from '../../fakes/llm-server.js'
import {startFakeMeepaChat} from '../../fakes/meepachat-server.js'
import {fakeLlmForTests} from '../../helpers/fake-llm-for-tests.js'
import {freePort} from '../../helpers/free-port.js'
import {fakeLlmConfig, makeHome, runCli, type TestHome} from '../../helpers/home.js'
import {spawnServeProcess, startServeProcess} from '../../helpers/serve-process.js'
import {waitFor} from '../../helpers/wait-for.js'

// One gateway per home: `serve` locks MEEPAGATEWAY_HOME before it reads or writes any state, so a
// second `serve` of the same home, whatever its config or port, exits 12 naming the first's pid.

let llm: FakeLlm
let home: TestHome | undefined
const cleanups: Array<() => Promise<void> | void> = []

fakeLlmForTests((started) => (llm = started), {resetBeforeEach: true})
afterEach(async () => {
  for (const cleanup of cleanups.splice(0).reverse()) await cleanup()
  home?.cleanup()
  home = undefined
})

/** A serve child that is SIGKILLed after the test if it still runs. */
function spawnServe(options: Parameters<typeof spawnServeProcess>[0]): ReturnType<typeof spawnServeProcess> {
  const serve = spawnServeProcess(options)
  cleanups.push(async () => {
    serve.process.kill('SIGKILL')
    await serve.process.catch(() => {})
  })
  return serve
}

/** The same config with another captain.port, in a file outside the home. */
function elsewhereConfig(config: Record<string, unknown>, port: number): string {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'meepa-other-config-'))
  cleanups.push(() => fs.rmSync(dir, {recursive: true, force: true}))
  const file = path.join(dir, 'config.yaml')
  fs.writeFileSync(file, YAML.stringify({...config, captain: {...(config.captain as object), port}}))
  return file
}

/** oclif's error box as one line (it wraps long messages behind ` › `). */
const unwrapped = (stderr: unknown) => String(stderr).replace(/\s*›\s*/g, ' ')

async function runRecords(): Promise<Array<{agent_id: string; status: string}>> {
  const result = await runCli(['runs', '--json'], {home: home!.home})
  expect(result.exitCode, result.stderr).toBe(0)
  return JSON.parse(result.stdout)
}

describe('one gateway per home (the real CLI)', {timeout: 120_000}, () => {
  it('of two gateways started at the same instant, ten times, exactly one serves; the other exits 12 naming its pid', async () => {
    const config = fakeLlmConfig(llm.openaiBaseUrl, [{id: 'a1'}], {
      captain: {enabled: true, bind: '127.0.0.1', port: await freePort()},
    })
    home = makeHome(config)
    const otherConfig = elsewhereConfig(config, await freePort())
    for (let round = 0; round < 10; round++) {
      // one reads the home's config.yaml, the other --config elsewhere with another port
      const pair = [spawnServe({home: home.home}), spawnServe({home: home.home, configPath: otherConfig})]
      const loser = await waitFor(
        'one serve to exit',
        () => pair.find((serve) => serve.process.exitCode !== null),
        20_000,
      )
      const winner = pair.find((serve) => serve !== loser)!
      const url = await waitFor(
        `the other serve to listen (round ${round})`,
        () => winner.listening() || winner.process.exitCode !== null,
        20_000,
      )
      expect(winner.process.exitCode, winner.output()).toBeNull()
      expect((await fetch(`${url}/healthz`)).status).toBe(200)
      const result = await loser.process
      expect(result.exitCode, loser.output()).toBe(12)
      expect(unwrapped(result.stderr)).toContain(
        `another gateway (pid ${winner.process.pid}) is already serving ${home.home}`,
      )
      expect(result.stderr).toContain('E_GATEWAY_RUNNING')
      // it stopped before the config and the state: it never logged a start
      expect(loser.output()).not.toContain('gateway: starting')
      // (a SIGTERM this early can come before serve handles signals: its exit status is not the point here)
      winner.process.kill('SIGTERM')
      await winner.process
    }
  })

  it("leaves a running gateway's run in flight alone: the record stays running and the reply arrives once", async () => {
    const chatServer = await startFakeMeepaChat({token: '5.token'})
    cleanups.push(() => chatServer.close())
    const connector = {type: 'meepachat', url: chatServer.gatewayUrl, bot_token: '5.token'}
    const config = fakeLlmConfig(
      llm.openaiBaseUrl,
      [
        {id: 'a1', connectors: [connector]},
        {id: 'a2', file_access: {unrestricted: true}},
      ],
      {captain: {enabled: true, bind: '127.0.0.1', port: await freePort()}},
    )
    home = makeHome(config)
    const first = await startServeProcess({home: home.home, env: {MEEPA_RETRY_BASE_MS: '20'}})
    cleanups.push(async () => {
      first.process.kill('SIGKILL')
      await first.process.catch(() => {})
    })
    await chatServer.waitForReadyCount(1, 20_000)

    // the model answers once the second gateways have come and gone
    let answer = () => {}
    const answered = new Promise<void>((resolve) => (answer = resolve))
    cleanups.push(() => answer())
    llm.enqueue(async () => {
      await answered
      return {text: 'the one answer'}
    })
    chatServer.userSays({channelId: 'general', content: 'take your time'})
    await waitFor('the run to call the LLM', () => llm.requests.length === 1)
    expect((await runRecords()).map((record) => record.status)).toEqual(['running'])

    // the same config (same port), then another port from a config elsewhere: neither touches the home
    for (const configPath of [undefined, elsewhereConfig(config, await freePort())]) {
      const started = Date.now()
      const second = spawnServe({home: home.home, configPath})
      const result = await second.process
      expect(result.exitCode, second.output()).toBe(12)
      expect(unwrapped(result.stderr)).toContain(
        `another gateway (pid ${first.process.pid}) is already serving ${home.home}`,
      )
      expect(Date.now() - started).toBeLessThan(5000)
      expect((await runRecords()).map((record) => record.status)).toEqual(['running'])
    }
    expect(chatServer.readyCount).toBe(1)

    // other commands do not take the lock: send for another agent is answered meanwhile
    llm.enqueue({text: 'send is not blocked'})
    const sent = await runCli(['send', '--agent', 'a2', 'hello'], {home: home.home})
    expect(sent.exitCode, sent.stderr).toBe(0)
    expect(sent.stdout).toContain('send is not blocked')

    expect((await runRecords()).find((record) => record.agent_id === 'a1')).toMatchObject({status: 'running'})
    answer()
    expect((await chatServer.waitForPosts(1, 20_000))[0]?.content).toBe('the one answer')
    await new Promise((resolve) => setTimeout(resolve, 1000))
    expect(chatServer.posts.map((post) => post.content)).toEqual(['the one answer'])
    const records = await runRecords()
    expect(records.find((record) => record.agent_id === 'a1')).toMatchObject({status: 'ok'})
    expect(first.output()).not.toMatch(/interrupted/)
    first.process.kill('SIGTERM')
    expect((await first.process).exitCode).toBe(0)
  })

  it('lets the next gateway serve at once after the first is SIGKILLed: the kernel drops the lock', async () => {
    const config = fakeLlmConfig(llm.openaiBaseUrl, [{id: 'a1'}], {
      captain: {enabled: true, bind: '127.0.0.1', port: await freePort()},
    })
    home = makeHome(config)
    const first = await startServeProcess({home: home.home})
    first.process.kill('SIGKILL')
    await first.process.catch(() => {})
    // its pid file is left behind, naming a dead process
    expect(fs.readFileSync(path.join(home.home, 'serve.pid'), 'utf8').trim()).toBe(String(first.process.pid))
    const next = await startServeProcess({home: home.home})
    cleanups.push(async () => {
      next.process.kill('SIGKILL')
      await next.process.catch(() => {})
    })
    expect(fs.readFileSync(path.join(home.home, 'serve.pid'), 'utf8').trim()).toBe(String(next.process.pid))
  })
})

describe('lockGatewayHome', () => {
  it('refuses a second lock of the same home, in this process too, until the first is released', async () => {
    home = makeHome()
    const lock = await lockGatewayHome(home.home)
    const refused = await lockGatewayHome(home.home).catch((error: unknown) => error)
    expect(refused).toBeInstanceOf(GatewayError)
    expect(refused).toMatchObject({code: 'E_GATEWAY_RUNNING', exitCode: 12, details: {pid: process.pid}})
    expect((refused as Error).message).toBe(
      `another gateway (pid ${process.pid}) is already serving ${home.home}; this one exits and changes nothing`,
    )
    // the refused attempt closed its own connection without dropping the holder's lock
    await expect(lockGatewayHome(home.home)).rejects.toMatchObject({code: 'E_GATEWAY_RUNNING'})
    lock.release()
    expect(fs.existsSync(path.join(home.home, 'serve.pid'))).toBe(false)
    ;(await lockGatewayHome(home.home)).release()
  })

  it('refuses a symlink planted at the lock file, and leaves its target alone', async () => {
    home = makeHome()
    // empty: a database SQLite would gladly lock and write, were the symlink followed
    const target = path.join(home.home, 'elsewhere.txt')
    fs.writeFileSync(target, '')
    fs.symlinkSync(target, path.join(home.home, 'serve.lock'))
    await expect(lockGatewayHome(home.home)).rejects.toMatchObject({
      code: 'E_STATE',
      message: expect.stringMatching(/serve\.lock is not a regular file \(a symlink\)/),
    })
    expect(fs.readFileSync(target, 'utf8')).toBe('')
  })
})
