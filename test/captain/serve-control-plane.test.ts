import Database from 'better-sqlite3'
import {execa, type ResultPromise} from 'execa'
import path from 'node:path'
import {afterEach, describe, expect, it} from 'vitest'
import {MIGRATIONS} from '../../src/runtime/state/gateway-db.js'
import {hashRandomToken} from '../../src/runtime/state/token-hash.js'
import type {FakeLlm} from '../fakes/llm-server.js'
import {fakeLlmForTests} from '../helpers/fake-llm-for-tests.js'
import {freePort} from '../helpers/free-port.js'
import {BIN, fakeLlmConfig, makeHome, runCli, type TestHome} from '../helpers/home.js'

const PASSWORD = 'serve control plane password'

let llm: FakeLlm
let home: TestHome | undefined
const running: ResultPromise[] = []

fakeLlmForTests((started) => (llm = started), {resetBeforeEach: true})
afterEach(async () => {
  for (const serve of running.splice(0)) {
    serve.kill('SIGKILL')
    await serve.catch(() => {})
  }
  home?.cleanup()
  home = undefined
})

/** `node bin/run.js serve` over dist/; resolves once it listens. */
async function startServe(): Promise<{url: string; output: () => string; stop(): Promise<void>}> {
  let output = ''
  const serve = execa(process.execPath, [BIN, 'serve', '--unrestricted', '--config', home!.configPath], {
    env: {MEEPAGATEWAY_HOME: home!.home, FAKE_LLM_KEY: 'sk-fake-test-key-123456', MEEPAGATEWAY_PASSWORD: PASSWORD},
    reject: false,
    timeout: 60_000,
  })
  running.push(serve)
  serve.stdout?.on('data', (chunk) => (output += String(chunk)))
  serve.stderr?.on('data', (chunk) => (output += String(chunk)))
  const deadline = Date.now() + 20_000
  while (!/listening on (http:\/\/\S+)/.test(output)) {
    if (serve.exitCode !== null || Date.now() > deadline) throw new Error(`serve did not start:\n${output}`)
    await new Promise((resolve) => setTimeout(resolve, 50))
  }
  return {
    url: (/listening on (http:\/\/\S+)/.exec(output) as RegExpExecArray)[1] as string,
    output: () => output,
    async stop() {
      serve.kill('SIGTERM')
      await serve
    },
  }
}

function call(url: string, method: string, route: string, key: string | undefined, body?: unknown): Promise<Response> {
  return fetch(url + route, {
    method,
    headers: {...(key ? {authorization: `Bearer ${key}`} : {}), ...(body === undefined ? {} : {'content-type': 'application/json'})},
    body: body === undefined ? undefined : JSON.stringify(body),
  })
}

describe('the control plane of a real `serve`', {timeout: 90_000}, () => {
  it('turns keys of an older gateway.db into chat keys, says so once, and they may only chat', async () => {
    const port = await freePort()
    home = makeHome(fakeLlmConfig(llm.openaiBaseUrl, [{id: 'a1'}], {captain: {enabled: true, bind: '127.0.0.1', port}}))
    // a gateway.db as the previous release left it: two migrations, one key, no kinds
    const db = new Database(path.join(home.home, 'gateway.db'))
    for (const migration of MIGRATIONS.slice(0, 2)) db.exec(migration.sql)
    db.pragma('user_version = 2')
    const oldKey = 'cptn_' + 'o'.repeat(43)
    db.prepare('INSERT INTO api_keys (id, name, key_hash, key_prefix, created_at) VALUES (?, ?, ?, ?, ?)').run('key_0123456789ab', 'old widget', hashRandomToken(oldKey), oldKey.slice(0, 11), Date.now())
    db.close()

    const first = await startServe()
    expect(first.output().match(/now CHAT keys/g)).toHaveLength(1)
    llm.enqueue({text: 'hello from the agent'})
    expect((await call(first.url, 'POST', '/api/chat', oldKey, {agent: 'a1', message: 'hi'})).status).toBe(200)
    const patch = await call(first.url, 'PATCH', '/api/captain/agents/a1', oldKey, {file_access: {unrestricted: true}})
    expect(patch.status).toBe(403)
    expect((await call(first.url, 'GET', '/api/captain/agents', oldKey)).status).toBe(403)
    await first.stop()
    const second = await startServe()
    expect(second.output()).not.toMatch(/now CHAT keys/)
    const list = await runCli(['api-key', 'list', '--json'], {home: home.home})
    expect(JSON.parse(list.stdout)).toMatchObject([{id: 'key_0123456789ab', kind: 'chat'}])
  })

  it('admin keys administer and are audited; `audit` prints it; `dashboard link` logs in once', async () => {
    const port = await freePort()
    home = makeHome(fakeLlmConfig(llm.openaiBaseUrl, [{id: 'a1'}], {captain: {enabled: true, bind: '127.0.0.1', port}}))
    const created = await runCli(['api-key', 'create', 'ops', '--admin', '--json'], {home: home.home})
    expect(created.exitCode).toBe(0)
    const admin = JSON.parse(created.stdout) as {id: string; key: string; kind: string}
    expect(admin.kind).toBe('admin')
    const chatKey = JSON.parse((await runCli(['api-key', 'create', 'widget', '--json'], {home: home.home})).stdout) as {key: string; kind: string}
    expect(chatKey.kind).toBe('chat')

    const serve = await startServe()
    expect((await call(serve.url, 'PATCH', '/api/captain/agents/a1', chatKey.key, {file_access: {unrestricted: true}})).status).toBe(403)
    expect((await call(serve.url, 'PATCH', '/api/captain/agents/a1', admin.key, {file_access: {unrestricted: true}})).status).toBe(200)
    expect((await call(serve.url, 'POST', '/api/captain/auth/login', undefined, {password: 'wrong guess!'})).status).toBe(401)
    expect(serve.output()).toMatch(/audit WARNING: agent a1 changed: file_access: null → \{"unrestricted":true\} \(WEAKENS ISOLATION: isolation host-sandbox → unrestricted\) \(by admin key key_\w+ \(ops\) from 127\.0\.0\.1\)/)

    const audit = await runCli(['audit', '--json'], {home: home.home})
    expect(audit.exitCode).toBe(0)
    const entries = JSON.parse(audit.stdout) as Array<{event: string; level: string; principal: string}>
    expect(entries.map((entry) => entry.event)).toEqual(['api_key_created', 'api_key_created', 'config_change', 'login_failed'])
    expect(entries[2]).toMatchObject({level: 'warning', principal: `admin key ${admin.id} (ops)`})
    const text = await runCli(['audit', '--since', '1h'], {home: home.home})
    expect(text.stdout).toMatch(/WARNING\s+config_change\s+admin key/)
    expect((await runCli(['audit', '--since', 'yesterday-ish'], {home: home.home})).exitCode).not.toBe(0)

    const link = await runCli(['dashboard', 'link'], {home: home.home})
    expect(link.exitCode).toBe(0)
    const url = new URL(link.stdout.trim())
    expect(url.origin).toBe(serve.url)
    expect(url.search).toBe('') // the secret is only in the fragment, never sent in a request line
    const secret = /^#login=(.+)$/.exec(url.hash)?.[1]
    const used = await call(serve.url, 'POST', '/api/captain/auth/link', undefined, {secret})
    expect(used.status).toBe(200)
    const {token} = (await used.json()) as {token: string}
    expect((await call(serve.url, 'GET', '/api/captain/agents', token)).status).toBe(200)
    expect((await call(serve.url, 'POST', '/api/captain/auth/link', undefined, {secret})).status).toBe(401)
  })

  it("keeps each key's conversation to itself: naming another key's channel reaches a namespaced one", async () => {
    const port = await freePort()
    home = makeHome(fakeLlmConfig(llm.openaiBaseUrl, [{id: 'a1'}], {captain: {enabled: true, bind: '127.0.0.1', port}}))
    const alice = JSON.parse((await runCli(['api-key', 'create', 'alice', '--json'], {home: home.home})).stdout) as {id: string; key: string}
    const mallory = JSON.parse((await runCli(['api-key', 'create', 'mallory', '--json'], {home: home.home})).stdout) as {id: string; key: string}
    const serve = await startServe()
    llm.setDefault({text: 'noted'})
    expect((await call(serve.url, 'POST', '/api/chat', alice.key, {agent: 'a1', message: 'my code word is PINEAPPLE-7731'})).status).toBe(200)
    expect((await call(serve.url, 'POST', '/api/chat', alice.key, {agent: 'a1', message: 'and in my project channel', channel: 'project'})).status).toBe(200)
    for (const channel of [`api-${alice.id}`, `api-${alice.id}/project`, `api-${alice.id}`.toUpperCase(), '../' + `api-${alice.id}`]) {
      const before = llm.requests.length
      expect((await call(serve.url, 'POST', '/api/chat', mallory.key, {agent: 'a1', message: 'what was the code word?', channel})).status).toBe(200)
      const prompts = JSON.stringify(llm.requests.slice(before).map((request) => request.body))
      expect(prompts, channel).not.toContain('PINEAPPLE')
      expect(prompts, channel).not.toContain('project channel')
    }
    // alice still has her history; mallory's messages did not land in it
    const before = llm.requests.length
    await call(serve.url, 'POST', '/api/chat', alice.key, {agent: 'a1', message: 'remind me'})
    const alicePrompt = JSON.stringify(llm.requests.slice(before).map((request) => request.body))
    expect(alicePrompt).toContain('PINEAPPLE-7731')
    expect(alicePrompt).not.toContain('what was the code word')
    // each key reads its own runs only
    const runs = (await (await call(serve.url, 'GET', '/api/chat/runs', mallory.key)).json()) as Array<{user_id: string; channel_id: string}>
    expect(runs).toHaveLength(4)
    expect(runs.every((run) => run.user_id === mallory.id && run.channel_id.startsWith(`api-${mallory.id}`))).toBe(true)
  })
})
