import Database from 'better-sqlite3'
import fs from 'node:fs'
import http from 'node:http'
import net from 'node:net'
import type {ResultPromise} from 'execa'
import path from 'node:path'
import {afterEach, describe, expect, it} from 'vitest'
import {MIGRATIONS} from '../../../src/runtime/state/gateway-db.js'
import {hashRandomToken} from '../../../src/runtime/state/token-hash.js'
import type {FakeLlm} from '../../fakes/llm-server.js'
import {fakeLlmForTests} from '../../helpers/fake-llm-for-tests.js'
import {freePort} from '../../helpers/free-port.js'
import {BIN, fakeLlmConfig, makeHome, runCli, type TestHome} from '../../helpers/home.js'
import {requireLandlockOrSkip} from '../../helpers/landlock-support.js'
import {startServeProcess} from '../../helpers/serve-process.js'
import {waitFor} from '../../helpers/wait-for.js'

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

async function startServe(
  env: Record<string, string> = {MEEPAGATEWAY_PASSWORD: PASSWORD},
  prefix?: string[],
): Promise<{url: string; output: () => string; stop(): Promise<void>}> {
  const serve = await startServeProcess({home: home!.home, configPath: home!.configPath, env, prefix})
  running.push(serve.process)
  return {
    ...serve,
    async stop() {
      serve.process.kill('SIGTERM')
      await serve.process
    },
  }
}

function call(url: string, method: string, route: string, key: string | undefined, body?: unknown): Promise<Response> {
  return fetch(url + route, {
    method,
    headers: {
      ...(key ? {authorization: `Bearer ${key}`} : {}),
      ...(body === undefined ? {} : {'content-type': 'application/json'}),
    },
    body: body === undefined ? undefined : JSON.stringify(body),
  })
}

/**
 * A request with any Host header (fetch does not let a caller choose it; a rebound DNS name does),
 * on a connection of its own.
 */
function withHost(url: string, method: string, route: string, host: string, body?: unknown): Promise<number> {
  return new Promise((resolve, reject) => {
    const target = new URL(route, url)
    const req = http.request(
      {
        host: target.hostname,
        port: target.port,
        path: target.pathname,
        method,
        headers: {host, 'content-type': 'application/json'},
        agent: false,
      },
      (res) => {
        res.resume()
        resolve(res.statusCode ?? 0)
      },
    )
    req.on('error', reject)
    req.end(body === undefined ? undefined : JSON.stringify(body))
  })
}

const landlock = requireLandlockOrSkip('minting a dashboard link from inside the host sandbox')
const hasPrlimit = fs.existsSync('/usr/bin/prlimit')

/** Opens `count` TCP connections to `url` that never send a byte (what a hostile local process can do). */
async function idleConnections(url: string, count: number): Promise<net.Socket[]> {
  const {hostname, port} = new URL(url)
  return Promise.all(
    Array.from(
      {length: count},
      () =>
        new Promise<net.Socket>((resolve) => {
          const socket = net.connect(Number(port), hostname, () => resolve(socket))
          socket.on('error', () => resolve(socket)) // refused or reset: it holds nothing
        }),
    ),
  )
}

describe('the control plane of a real `serve`', {timeout: 90_000}, () => {
  it.skipIf(!landlock)(
    'a sandboxed agent cannot mint a dashboard login link: gateway.db is out of its reach',
    async () => {
      home = makeHome(fakeLlmConfig(llm.openaiBaseUrl, [{id: 'a1'}]))
      expect((await runCli(['api-key', 'list'], {home: home.home})).exitCode).toBe(0) // gateway.db exists
      expect((await runCli(['agent', 'create', 'a1'], {home: home.home})).exitCode).toBe(0)
      // a config of the agent's own (readable to it) gets as far as gateway.db
      fs.copyFileSync(home.configPath, path.join(home.workspace('a1'), 'own-config.yaml'))
      for (const config of [home.configPath, path.join(home.workspace('a1'), 'own-config.yaml')]) {
        const inside = await runCli(
          [
            'sandbox',
            'exec',
            '--agent',
            'a1',
            '--',
            'env',
            `MEEPAGATEWAY_HOME=${home.home}`,
            process.execPath,
            BIN,
            'dashboard',
            'link',
            '--config',
            config,
          ],
          {home: home.home},
        )
        expect(inside.exitCode, inside.stdout + inside.stderr).not.toBe(0)
        expect(inside.stdout + inside.stderr).not.toMatch(/#login=/)
        if (config !== home.configPath) expect(inside.stderr).toMatch(/cannot open the gateway database/)
      }
      const db = new Database(path.join(home.home, 'gateway.db'), {readonly: true})
      expect(db.prepare('SELECT count(*) AS n FROM captain_login_links').get()).toEqual({n: 0})
      db.close()
    },
  )

  it('answers a rebound DNS name with 421 in setup-code mode, before the session state or a setup code is looked at', async () => {
    const port = await freePort()
    home = makeHome(fakeLlmConfig(llm.openaiBaseUrl, [{id: 'a1'}], {captain: {enabled: true, bind: '127.0.0.1', port}}))
    const serve = await startServe({})
    // the dashboard's line may come on its stream a moment after the one serve's start waits for
    const code = await waitFor(
      "the setup code in serve's output",
      () => /setup code ([A-Z0-9]{3}-[A-Z0-9]{3}-[A-Z0-9]{3})/.exec(serve.output())?.[1],
    )
    expect(await withHost(serve.url, 'GET', '/api/captain/auth/session', `evil.example:${port}`)).toBe(421)
    expect(
      await withHost(serve.url, 'POST', '/api/captain/auth/setup', `evil.example:${port}`, {
        code,
        password: 'rebinding attacker',
      }),
    ).toBe(421)
    expect(await withHost(serve.url, 'GET', '/captain/', 'evil.example')).toBe(421)
    expect(await withHost(serve.url, 'GET', '/api/captain/auth/session', `localhost:${port}`)).toBe(200)
    const state = (await (await fetch(`${serve.url}/api/captain/auth/session`)).json()) as {setup_required: boolean}
    expect(state.setup_required).toBe(true) // the attacker's setup attempt never ran
  })

  it('turns keys of an older gateway.db into chat keys, says so once, and they may only chat', async () => {
    const port = await freePort()
    home = makeHome(fakeLlmConfig(llm.openaiBaseUrl, [{id: 'a1'}], {captain: {enabled: true, bind: '127.0.0.1', port}}))
    // a gateway.db as the previous release left it: two migrations, one key, no kinds
    const db = new Database(path.join(home.home, 'gateway.db'))
    for (const migration of MIGRATIONS.slice(0, 2)) db.exec(migration.sql)
    db.pragma('user_version = 2')
    const oldKey = 'cptn_' + 'o'.repeat(43)
    db.prepare('INSERT INTO api_keys (id, name, key_hash, key_prefix, created_at) VALUES (?, ?, ?, ?, ?)').run(
      'key_0123456789ab',
      'old widget',
      hashRandomToken(oldKey),
      oldKey.slice(0, 11),
      Date.now(),
    )
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
    const chatKey = JSON.parse((await runCli(['api-key', 'create', 'widget', '--json'], {home: home.home})).stdout) as {
      key: string
      kind: string
    }
    expect(chatKey.kind).toBe('chat')

    const serve = await startServe()
    expect(
      (await call(serve.url, 'PATCH', '/api/captain/agents/a1', chatKey.key, {file_access: {unrestricted: true}}))
        .status,
    ).toBe(403)
    expect(
      (await call(serve.url, 'PATCH', '/api/captain/agents/a1', admin.key, {file_access: {unrestricted: true}})).status,
    ).toBe(200)
    expect(
      (await call(serve.url, 'POST', '/api/captain/auth/login', undefined, {password: 'wrong guess!'})).status,
    ).toBe(401)
    expect(serve.output()).toMatch(
      /audit WARNING: agent a1 changed: file_access: null → \{"unrestricted":true\} \(WEAKENS ISOLATION: isolation host-sandbox → unrestricted\) \(by admin key key_\w+ \(ops\) from 127\.0\.0\.1\)/,
    )

    const audit = await runCli(['audit', '--json'], {home: home.home})
    expect(audit.exitCode).toBe(0)
    const entries = JSON.parse(audit.stdout) as Array<{event: string; level: string; principal: string}>
    expect(entries.map((entry) => entry.event)).toEqual([
      'api_key_created',
      'api_key_created',
      'config_change',
      'login_failed',
    ])
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

  it('`dashboard link` with captain.port 0 names the port the running gateway got, and refuses to guess without one', async () => {
    home = makeHome(
      fakeLlmConfig(llm.openaiBaseUrl, [{id: 'a1'}], {captain: {enabled: true, bind: '127.0.0.1', port: 0}}),
    )
    const linksMinted = () => {
      const db = new Database(path.join(home!.home, 'gateway.db'), {readonly: true})
      const {n} = db.prepare('SELECT count(*) AS n FROM captain_login_links').get() as {n: number}
      db.close()
      return n
    }
    const refused = async () => {
      const link = await runCli(['dashboard', 'link'], {home: home!.home})
      expect(link.exitCode, link.stdout + link.stderr).toBe(3)
      expect(link.stdout).not.toMatch(/http:/)
      const said = link.stderr.replace(/\s*\n\s*›\s*/g, ' ') // oclif wraps its lines
      expect(said).toMatch(
        /captain\.port is 0 in .*config\.yaml: the dashboard listens on a port chosen when the gateway starts, and no gateway of .* is running/,
      )
      expect(said).toMatch(/start the gateway \(meepagateway serve\), then run meepagateway dashboard link again/)
      expect(said).toMatch(/set captain\.port in config\.yaml to a fixed port/)
    }
    expect((await runCli(['api-key', 'list'], {home: home.home})).exitCode).toBe(0) // gateway.db exists
    await refused()
    expect(linksMinted()).toBe(0) // nothing unusable was minted

    const first = await startServe()
    expect(new URL(first.url).port).not.toBe('0')
    const link = await runCli(['dashboard', 'link'], {home: home.home})
    expect(link.exitCode, link.stderr).toBe(0)
    const url = new URL(link.stdout.trim())
    expect(url.origin).toBe(first.url)
    const secret = /^#login=(.+)$/.exec(url.hash)?.[1]
    expect((await call(first.url, 'POST', '/api/captain/auth/link', undefined, {secret})).status).toBe(200)
    await first.stop()
    await refused() // a stopped gateway's port is nobody's

    // a gateway killed without stopping leaves its record: a dead process's port is not used either
    const second = await startServe()
    expect(new URL((await runCli(['dashboard', 'link'], {home: home.home})).stdout.trim()).origin).toBe(second.url)
    const killed = running.pop()!
    killed.kill('SIGKILL')
    await killed.catch(() => {})
    await refused()
  })

  it("keeps each key's conversation to itself: naming another key's channel reaches a namespaced one", async () => {
    const port = await freePort()
    home = makeHome(fakeLlmConfig(llm.openaiBaseUrl, [{id: 'a1'}], {captain: {enabled: true, bind: '127.0.0.1', port}}))
    const alice = JSON.parse((await runCli(['api-key', 'create', 'alice', '--json'], {home: home.home})).stdout) as {
      id: string
      key: string
    }
    const mallory = JSON.parse(
      (await runCli(['api-key', 'create', 'mallory', '--json'], {home: home.home})).stdout,
    ) as {id: string; key: string}
    const serve = await startServe()
    llm.setDefault({text: 'noted'})
    expect(
      (await call(serve.url, 'POST', '/api/chat', alice.key, {agent: 'a1', message: 'my code word is PINEAPPLE-7731'}))
        .status,
    ).toBe(200)
    expect(
      (
        await call(serve.url, 'POST', '/api/chat', alice.key, {
          agent: 'a1',
          message: 'and in my project channel',
          channel: 'project',
        })
      ).status,
    ).toBe(200)
    for (const channel of [
      `api-${alice.id}`,
      `api-${alice.id}/project`,
      `api-${alice.id}`.toUpperCase(),
      '../' + `api-${alice.id}`,
    ]) {
      const before = llm.requests.length
      expect(
        (
          await call(serve.url, 'POST', '/api/chat', mallory.key, {
            agent: 'a1',
            message: 'what was the code word?',
            channel,
          })
        ).status,
      ).toBe(200)
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
    const runs = (await (await call(serve.url, 'GET', '/api/chat/runs', mallory.key)).json()) as Array<{
      user_id: string
      channel_id: string
    }>
    expect(runs).toHaveLength(4)
    expect(runs.every((run) => run.user_id === mallory.id && run.channel_id.startsWith(`api-${mallory.id}`))).toBe(true)
  })

  it.skipIf(!hasPrlimit)(
    "a flood of idle connections cannot use up the gateway's file descriptors: queued runs still start",
    async () => {
      const port = await freePort()
      home = makeHome(
        fakeLlmConfig(llm.openaiBaseUrl, [{id: 'a1'}], {captain: {enabled: true, bind: '127.0.0.1', port}}),
      )
      const key = JSON.parse((await runCli(['api-key', 'create', 'widget', '--json'], {home: home.home})).stdout) as {
        key: string
      }
      const serve = await startServe(undefined, ['prlimit', '--nofile=256:256'])
      llm.enqueue({text: 'first', delayMs: 1500}, {text: 'second'})
      // the second message waits behind the first (one run at a time per agent): its run starts during the flood
      const first = call(serve.url, 'POST', '/api/chat', key.key, {agent: 'a1', message: 'one'})
      await new Promise((resolve) => setTimeout(resolve, 300))
      const second = call(serve.url, 'POST', '/api/chat', key.key, {agent: 'a1', message: 'two'})
      await new Promise((resolve) => setTimeout(resolve, 200))
      const flood = await idleConnections(serve.url, 400)
      try {
        expect((await first).status).toBe(200)
        const answer = await second
        expect(answer.status, await answer.clone().text()).toBe(200)
        expect(((await answer.json()) as {reply: string}).reply).toBe('second')
        // a client that sends its request at once still gets in: the flood's idle connections make room
        // (on a new connection: fetch's pooled one may be among the idle ones the gateway closed)
        flood.push(...(await idleConnections(serve.url, 400)))
        expect(await withHost(serve.url, 'GET', '/healthz', new URL(serve.url).host)).toBe(200)
        expect(serve.output()).toMatch(/http: 128 connections are open \(the cap\); closing the oldest idle one/)
      } finally {
        for (const socket of flood) socket.destroy()
      }
    },
  )
})
