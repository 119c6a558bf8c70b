import {execa, type ResultPromise} from 'execa'
import fs from 'node:fs'
import {afterEach, describe, expect, it} from 'vitest'
import type {FakeLlm} from '../../fakes/llm-server.js'
import {startFakeMeepaChat} from '../../fakes/meepachat-server.js'
import {fakeLlmForTests} from '../../helpers/fake-llm-for-tests.js'
import {BIN, fakeLlmConfig, makeHome, runCli, type TestHome} from '../../helpers/home.js'
import {requireLandlockOrSkip} from '../../helpers/landlock-support.js'
import {freePort} from '../../helpers/free-port.js'
import {startServeProcess} from '../../helpers/serve-process.js'

const landlock = requireLandlockOrSkip('serve in the host-sandbox level')

let llm: FakeLlm
let home: TestHome | undefined
let serve: ResultPromise | undefined

fakeLlmForTests((started) => (llm = started))
afterEach(async () => {
  if (serve && serve.exitCode === null) {
    serve.kill('SIGKILL')
    await serve.catch(() => {})
  }
  serve = undefined
  home?.cleanup()
  home = undefined
})

/** Starts `node bin/run.js serve` and resolves once it listens; `output()` is everything it logged. */
async function startServe(args: string[] = ['--unrestricted']): Promise<{url: string; output: () => string}> {
  const started = await startServeProcess({home: home!.home, configPath: home!.configPath, args})
  serve = started.process
  return started
}

async function createKey(): Promise<string> {
  const created = await runCli(['api-key', 'create', 'tests', '--json'], {home: home!.home})
  expect(created.exitCode).toBe(0)
  const parsed = JSON.parse(created.stdout)
  expect(Object.keys(parsed).sort()).toEqual(['id', 'key', 'kind', 'name'])
  return parsed.key
}

function chat(url: string, key: string, body: Record<string, unknown>): Promise<Response> {
  return fetch(`${url}/api/chat`, {
    method: 'POST',
    headers: {authorization: `Bearer ${key}`, 'content-type': 'application/json'},
    body: JSON.stringify(body),
  })
}

describe('meepagateway serve (the real CLI)', {timeout: 90_000}, () => {
  it('lets a run in flight finish on SIGTERM, exits 0, and keeps --unrestricted out of the config', async () => {
    const port = await freePort()
    home = makeHome(
      fakeLlmConfig(llm.openaiBaseUrl, [{id: 'a1'}], {
        captain: {enabled: true, bind: '127.0.0.1', port},
        gateway: {shutdown_grace_seconds: 20},
      }),
    )
    const configBefore = fs.readFileSync(home.configPath, 'utf8')
    const key = await createKey()
    const {url, output} = await startServe()
    expect(url).toBe(`http://127.0.0.1:${port}`)
    expect((await fetch(`${url}/healthz`)).status).toBe(200)

    llm.enqueue({text: 'finished despite SIGTERM', delayMs: 1500})
    const requestsBefore = llm.requests.length
    const pending = chat(url, key, {agent: 'a1', message: 'slow one'})
    while (llm.requests.length === requestsBefore) await new Promise((resolve) => setTimeout(resolve, 20))
    serve!.kill('SIGTERM')

    const response = await pending
    expect(response.status).toBe(200)
    expect(((await response.json()) as {reply: string}).reply).toContain('finished despite SIGTERM')
    const result = await serve!
    expect(result.exitCode).toBe(0)
    expect(output()).toMatch(/SIGTERM received/)
    expect(output()).toMatch(/stopping; waiting up to 20 s for 1 running run/)
    expect(output()).toMatch(/gateway: stopped/)
    expect(fs.readFileSync(home.configPath, 'utf8')).toBe(configBefore)

    const runs = await runCli(['runs', '--json'], {home: home.home})
    const [record] = JSON.parse(runs.stdout)
    expect(record).toMatchObject({agent_id: 'a1', connector: 'webchat', status: 'ok', isolation: 'unrestricted'})
  })

  it('stops a run that outlasts the grace period, records it as interrupted, and still exits 0', async () => {
    const port = await freePort()
    home = makeHome(
      fakeLlmConfig(llm.openaiBaseUrl, [{id: 'a1'}], {
        captain: {enabled: true, bind: '127.0.0.1', port},
        gateway: {shutdown_grace_seconds: 1},
      }),
    )
    const key = await createKey()
    const {url} = await startServe()
    llm.enqueue({text: 'too late', delayMs: 15_000})
    const requestsBefore = llm.requests.length
    const pending = chat(url, key, {agent: 'a1', message: 'very slow'})
    while (llm.requests.length === requestsBefore) await new Promise((resolve) => setTimeout(resolve, 20))
    const killedAt = Date.now()
    serve!.kill('SIGTERM')
    const response = await pending
    expect(response.status).toBe(503)
    expect(((await response.json()) as {reply: string}).reply).toMatch(/restarted before I finished/)
    expect((await serve!).exitCode).toBe(0)
    expect(Date.now() - killedAt).toBeLessThan(8000)
    const [record] = JSON.parse((await runCli(['runs', '--json'], {home: home.home})).stdout)
    expect(record).toMatchObject({status: 'interrupted'})
  })

  it('reports a MeepaChat server it cannot reach and keeps serving web chat', async () => {
    const port = await freePort()
    const deadPort = await freePort()
    home = makeHome(
      fakeLlmConfig(
        llm.openaiBaseUrl,
        [
          {
            id: 'a1',
            connectors: [{type: 'meepachat', url: `ws://127.0.0.1:${deadPort}/api/bot-gateway`, bot_token: '1.x'}],
          },
        ],
        {captain: {enabled: true, bind: '127.0.0.1', port}},
      ),
    )
    const key = await createKey()
    const {url, output} = await startServe()
    const deadline = Date.now() + 10_000
    while (
      !/a1\/meepachat: reconnecting \(.*ECONNREFUSED.*next attempt in 1 s\)/.test(output()) &&
      Date.now() < deadline
    )
      await new Promise((resolve) => setTimeout(resolve, 50))
    expect(output()).toMatch(/connector a1\/meepachat: connecting \(ws:\/\/127\.0\.0\.1:\d+\/api\/bot-gateway\)/)
    expect(output()).toMatch(/a1\/meepachat: reconnecting \(.*ECONNREFUSED.*next attempt in 1 s\)/)
    llm.enqueue({text: 'web chat still works'})
    expect(((await (await chat(url, key, {agent: 'a1', message: 'hi'})).json()) as {reply: string}).reply).toBe(
      'web chat still works',
    )
    serve!.kill('SIGINT')
    expect((await serve!).exitCode).toBe(0)
  })

  it('never logs a configured secret, even one a library or an operator puts in a log line', async () => {
    const deadPort = await freePort()
    // the bot token is also (carelessly) pasted into the URL path, which the connector logs
    home = makeHome(
      fakeLlmConfig(
        llm.openaiBaseUrl,
        [
          {
            id: 'a1',
            connectors: [
              {
                type: 'meepachat',
                url: `ws://127.0.0.1:${deadPort}/api/bot-gateway/sk-fake-test-key-123456`,
                bot_token: '$FAKE_LLM_KEY',
              },
            ],
          },
        ],
        {captain: {enabled: false, bind: '127.0.0.1', port: await freePort()}},
      ),
    )
    const {output} = await startServe()
    const deadline = Date.now() + 10_000
    while (!output().includes('next attempt in') && Date.now() < deadline)
      await new Promise((resolve) => setTimeout(resolve, 50))
    expect(output()).toContain('/api/bot-gateway/[REDACTED]')
    expect(output()).not.toContain('sk-fake-test-key-123456')
    serve!.kill('SIGTERM')
    expect((await serve!).exitCode).toBe(0)
  })

  it('answers MeepaChat messages end to end through the real CLI (alias start)', async () => {
    const port = await freePort()
    const chatServer = await startFakeMeepaChat({token: '5.token'})
    try {
      home = makeHome(
        fakeLlmConfig(
          llm.openaiBaseUrl,
          [{id: 'a1', connectors: [{type: 'meepachat', url: chatServer.gatewayUrl, bot_token: '5.token'}]}],
          {captain: {enabled: true, bind: '127.0.0.1', port}},
        ),
      )
      let output = ''
      serve = execa(process.execPath, [BIN, 'start', '--config', home.configPath, '--unrestricted'], {
        env: {MEEPAGATEWAY_HOME: home.home, FAKE_LLM_KEY: 'k'},
        reject: false,
        timeout: 60_000,
      })
      serve.stdout?.on('data', (chunk) => (output += String(chunk)))
      await chatServer.waitForReadyCount(1, 20_000)
      llm.enqueue({text: 'hello via the CLI'})
      chatServer.userSays({channelId: 'general', content: 'hi'})
      expect((await chatServer.waitForPosts(1))[0]?.content).toBe('hello via the CLI')
      serve.kill('SIGTERM')
      expect((await serve).exitCode).toBe(0)
      expect(output).toMatch(/connector a1\/meepachat: connected \(as meepabot, 1 server\(s\), 1 DM channel\(s\)\)/)
      expect(output).toMatch(/connector a1\/meepachat: stopped/)
    } finally {
      await chatServer.close()
    }
  })

  it.runIf(landlock)('runs agents in the host sandbox by default and records the level', async () => {
    const port = await freePort()
    home = makeHome(fakeLlmConfig(llm.openaiBaseUrl, [{id: 'a1'}], {captain: {enabled: true, bind: '127.0.0.1', port}}))
    const key = await createKey()
    const {url} = await startServe([])
    llm.enqueue({text: 'sandboxed hello'})
    const response = await chat(url, key, {agent: 'a1', message: 'hi'})
    expect(((await response.json()) as {reply: string}).reply).toBe('sandboxed hello')
    serve!.kill('SIGTERM')
    expect((await serve!).exitCode).toBe(0)
    expect(JSON.parse((await runCli(['runs', '--json'], {home: home.home})).stdout)[0]).toMatchObject({
      status: 'ok',
      isolation: 'host-sandbox',
    })
  })

  it('exits non-zero with the schema message on a config error', async () => {
    home = makeHome(fakeLlmConfig(llm.openaiBaseUrl, [{id: 'a1', container_mode: {memory_limit: 'lots'}}]))
    const result = await runCli(['serve', '--config', home.configPath], {home: home.home})
    expect(result.exitCode).toBe(3)
    expect(result.stderr).toMatch(/agents\[0\]\.container_mode\.memory_limit: must match/)
  })

  it('marks runs a killed gateway left running as interrupted at the next start', async () => {
    const port = await freePort()
    home = makeHome(fakeLlmConfig(llm.openaiBaseUrl, [{id: 'a1'}], {captain: {enabled: true, bind: '127.0.0.1', port}}))
    const key = await createKey()
    const first = await startServe()
    llm.enqueue({text: 'never delivered', delayMs: 10_000})
    const requestsBefore = llm.requests.length
    void chat(first.url, key, {agent: 'a1', message: 'doomed'}).catch(() => {})
    while (llm.requests.length === requestsBefore) await new Promise((resolve) => setTimeout(resolve, 20))
    serve!.kill('SIGKILL')
    await serve!
    expect(JSON.parse((await runCli(['runs', '--json'], {home: home.home})).stdout)[0]).toMatchObject({
      status: 'running',
    })
    const second = await startServe()
    expect(second.output()).toMatch(/marked 1 run\(s\) left running by a previous gateway as interrupted/)
    serve!.kill('SIGTERM')
    await serve!
    expect(JSON.parse((await runCli(['runs', '--json'], {home: home.home})).stdout)[0]).toMatchObject({
      status: 'interrupted',
    })
  })
})

describe('api-key and runs commands', {timeout: 90_000}, () => {
  it('creates, lists and revokes keys; a revoked key gets 401 from a running gateway', async () => {
    const port = await freePort()
    home = makeHome(
      fakeLlmConfig(llm.openaiBaseUrl, [{id: 'a1'}, {id: 'b2'}], {captain: {enabled: true, bind: '127.0.0.1', port}}),
    )
    const created = await runCli(['api-key', 'create', 'laptop'], {home: home.home})
    expect(created.exitCode).toBe(0)
    const key = (/(cptn_\S+)/.exec(created.stdout) as RegExpExecArray)[1] as string
    expect(created.stdout).toMatch(/cannot be shown again/)
    const list = JSON.parse((await runCli(['api-key', 'list', '--json'], {home: home.home})).stdout)
    expect(list).toHaveLength(1)
    expect(JSON.stringify(list)).not.toContain(key)
    expect((await runCli(['api-key', 'list'], {home: home.home})).stdout).toMatch(
      /laptop\s+chat\s+cptn_\S{6}…\s.*active/,
    )

    const {url} = await startServe()
    llm.setDefault({text: 'ok'})
    expect((await chat(url, key, {agent: 'a1', message: 'one'})).status).toBe(200)
    expect((await chat(url, key, {agent: 'b2', message: 'two'})).status).toBe(200)
    const revoked = await runCli(['api-key', 'revoke', list[0].id], {home: home.home})
    expect(revoked.stdout).toMatch(/revoked API key key_\w+ \(laptop\)/)
    expect((await chat(url, key, {agent: 'a1', message: 'three'})).status).toBe(401)
    llm.setDefault(undefined)

    const table = await runCli(['runs'], {home: home.home})
    expect(table.stdout.split('\n')[0]).toMatch(
      /^STARTED \(UTC\)\s+RUN\s+AGENT\s+CONNECTOR\s+CHANNEL\s+ISOLATION\s+STATUS\s+REPLY\s+DURATION\s+TOKENS IN\/OUT\s+FILES\s+ERROR/,
    )
    expect(table.stdout).toMatch(/b2\s+webchat\s+api-key_\w+\s+unrestricted\s+ok/)
    const onlyA = JSON.parse((await runCli(['runs', '--agent', 'a1', '--json'], {home: home.home})).stdout)
    expect(onlyA.map((run: {agent_id: string}) => run.agent_id)).toEqual(['a1'])
    expect(JSON.parse((await runCli(['runs', '--limit', '1', '--json'], {home: home.home})).stdout)).toHaveLength(1)
    const missing = await runCli(['api-key', 'revoke', 'key_nope'], {home: home.home})
    expect(missing.exitCode).toBe(4)
    expect(missing.stderr).toMatch(/no API key with id key_nope/)
    serve!.kill('SIGTERM')
    expect((await serve!).exitCode).toBe(0)
  })
})
