import Database from 'better-sqlite3'
import {execa} from 'execa'
import fs from 'node:fs'
import path from 'node:path'
import {afterEach, describe, expect, it} from 'vitest'
import type {FakeLlm, FakeRequest} from '../../fakes/llm-server.js'
import {startFakeMeepaChat} from '../../fakes/meepachat-server.js'
import {fakeLlmForTests} from '../../helpers/fake-llm-for-tests.js'
import {freePort} from '../../helpers/free-port.js'
import {fakeLlmConfig, makeHome, runCli} from '../../helpers/home.js'
import {startServe, type ServeProcess} from '../../helpers/serve.js'

/*
 * Faults of the gateway's own state, injected under `serve` and `send` from bin/run.js: a
 * gateway.db damaged or deleted at start-up and while serving, a damaged memory.db, and a
 * `serve` SIGKILLed mid-run whose users must still hear back. What must hold: the gateway says
 * what is wrong and how to fix it, keeps answering what it can, and loses nothing it had.
 */

const TOKEN = '11.meepa-secret'
const RESTARTED = /I was restarted before I finished/
let llm: FakeLlm
fakeLlmForTests((started) => (llm = started), {resetBeforeEach: true})

const cleanups: Array<() => Promise<void> | void> = []
afterEach(async () => {
  for (const cleanup of cleanups.splice(0).reverse()) await cleanup()
})

const lastUserMessage = (request: FakeRequest) =>
  String(
    (request.body.messages as Array<{role: string; content: unknown}>)
      .filter((message) => message.role === 'user')
      .at(-1)?.content ?? '',
  )

async function setup(options: {meepachat?: boolean} = {}) {
  const port = await freePort()
  const chat = options.meepachat ? await startFakeMeepaChat({token: TOKEN}) : undefined
  if (chat) cleanups.push(() => chat.close())
  const home = makeHome(
    fakeLlmConfig(
      llm.openaiBaseUrl,
      [
        {
          id: 'meepa',
          file_access: {unrestricted: true},
          // under root the workspace is a volume of this size: small enough to reserve on the small home below
          limits: {disk: '8m'},
          connectors: chat ? [{type: 'meepachat', url: chat.gatewayUrl, bot_token: TOKEN}] : [],
        },
      ],
      {
        captain: {enabled: true, bind: '127.0.0.1', port},
        gateway: {shutdown_grace_seconds: 3},
      },
    ),
  )
  cleanups.push(() => home.cleanup())
  const dbFile = path.join(home.home, 'gateway.db')
  const serves: ServeProcess[] = []
  const serve = async (apiKey?: string) => {
    const started = await startServe({home: home.home, port, apiKey})
    serves.push(started)
    cleanups.push(async () => {
      if (started.process.exitCode === null) await started.stop()
    })
    return started
  }
  const runs = () => {
    const db = new Database(dbFile, {readonly: true})
    try {
      return db.prepare('SELECT * FROM runs ORDER BY started_at').all() as Array<{
        id: string
        status: string
        channel_id: string
        thread_id: string | null
        restart_reply: string | null
        delivery: string | null
      }>
    } finally {
      db.close()
    }
  }
  return {home, port, chat, dbFile, serve, runs}
}

/** Overwrites `length` bytes at `offset` with garbage, in place (same file, same inode). */
function scribble(file: string, offset: number, length: number): void {
  const fd = fs.openSync(file, 'r+')
  fs.writeSync(fd, Buffer.alloc(length, 0x5a), 0, length, offset)
  fs.closeSync(fd)
}

describe('gateway.db at start-up', () => {
  it('damaged pages: serve exits 5 naming the file and the fix, instead of a bare "malformed"', async () => {
    const {home, dbFile} = await setup()
    expect((await runCli(['api-key', 'create', 'tests'], {home: home.home})).exitCode).toBe(0)
    const db = new Database(dbFile)
    const insert = db.prepare(
      `INSERT INTO runs (id, agent_id, connector, channel_id, isolation, status, started_at) VALUES (?, 'meepa', 'cli', 'c', 'unrestricted', 'ok', ?)`,
    )
    for (let i = 0; i < 300; i++) insert.run(`run_${i}`, Date.now())
    db.close()
    const size = fs.statSync(dbFile).size
    expect(size).toBeGreaterThan(8192)
    scribble(dbFile, 4096, size - 4096) // every page but the first (schema and header)
    const result = await runCli(['serve'], {home: home.home, timeoutMs: 30_000})
    expect(result.exitCode).toBe(5)
    expect(result.stderr).toContain(dbFile)
    expect(result.stderr).toMatch(/is damaged/)
    expect(result.stderr).toMatch(/\.recover/)
  })

  it('a file that is not a database at all: the same', async () => {
    const {home, dbFile} = await setup()
    fs.writeFileSync(dbFile, 'this is not a database '.repeat(500))
    const result = await runCli(['serve'], {home: home.home, timeoutMs: 30_000})
    expect(result.exitCode).toBe(5)
    expect(result.stderr).toContain(`the gateway database ${dbFile} is damaged`)
  })
})

describe('gateway.db under a running gateway', () => {
  it('deleted (with its -wal and -shm): restored from the open database, so records and API keys survive a restart', async () => {
    llm.setDefault({text: 'pong'})
    const {dbFile, serve, runs} = await setup()
    const first = await serve()
    expect((await first.chat('meepa', 'one')).reply).toBe('pong')
    for (const suffix of ['', '-wal', '-shm']) fs.rmSync(dbFile + suffix, {force: true})
    await first.waitForOutput(/restored .*gateway\.db from the open database/, 10_000)
    expect((await first.chat('meepa', 'two')).reply).toBe('pong')
    await first.stop()
    expect(runs().map((run) => run.status)).toEqual(['ok', 'ok'])
    // the API key created before the deletion still opens the web chat after a restart
    const second = await serve(first.apiKey)
    expect((await second.chat('meepa', 'three')).reply).toBe('pong')
  })

  it('replaced by a file that is not a database: moved aside, the open database restored, nothing lost', async () => {
    llm.setDefault({text: 'pong'})
    const {dbFile, serve, runs, home} = await setup()
    const first = await serve()
    expect((await first.chat('meepa', 'one')).reply).toBe('pong')
    fs.writeFileSync(`${dbFile}.new`, 'garbage '.repeat(1000))
    fs.renameSync(`${dbFile}.new`, dbFile)
    await first.waitForOutput(
      /is not usable .*moved it to .*gateway\.db\.corrupt-.* and restored the open database/,
      10_000,
    )
    expect((await first.chat('meepa', 'two')).reply).toBe('pong')
    expect(fs.readdirSync(home.home).filter((name) => name.startsWith('gateway.db.corrupt-'))).toHaveLength(1)
    await first.stop()
    expect(runs()).toHaveLength(2)
  })

  it('damaged in place: detected, moved aside and rebuilt from the open database; messages go on and no record is lost', async () => {
    llm.setDefault((request) => ({text: `You said: ${lastUserMessage(request)}`}))
    const {chat, dbFile, serve, runs, home} = await setup({meepachat: true})
    const gateway = await serve()
    await chat!.waitForReadyCount(1)
    chat!.userSays({channelId: 'general', content: 'before'})
    await chat!.waitForPosts(1)
    scribble(dbFile, 0, fs.statSync(dbFile).size)
    await gateway.waitForOutput(/gateway\.db was damaged while the gateway was running/, 10_000)
    await gateway.waitForOutput(/moved it to .*gateway\.db\.corrupt-/, 10_000)
    chat!.userSays({channelId: 'general', content: 'after the damage'})
    const posts = await chat!.waitForPosts(2)
    expect(posts[1]?.content).toContain('You said: after the damage')
    expect(JSON.stringify(await gateway.healthz())).toMatch(/^{"status":200/)
    await gateway.stop()
    expect(runs().map((run) => run.status)).toEqual(['ok', 'ok'])
    expect(fs.readdirSync(home.home).some((name) => name.startsWith('gateway.db.corrupt-'))).toBe(true)
  })

  it('unwritable (its journal made immutable): the message still runs, the lost record is logged, /healthz says degraded (503) until writes work again', async () => {
    llm.setDefault({text: 'pong'})
    const {dbFile, serve, runs} = await setup()
    const gateway = await serve()
    expect((await gateway.chat('meepa', 'one')).reply).toBe('pong')
    await execa('chattr', ['+i', `${dbFile}-wal`])
    cleanups.push(async () => void (await execa('chattr', ['-i', `${dbFile}-wal`], {reject: false})))
    expect((await gateway.chat('meepa', 'two')).reply).toBe('pong')
    expect(gateway.output()).toMatch(/could not write its record \(the run goes on\)/)
    const health = await gateway.healthz()
    expect(health.status).toBe(503)
    expect(health.body.status).toBe('degraded')
    expect(health.body.reasons?.join('\n')).toMatch(/state database unwritable/)
    await execa('chattr', ['-i', `${dbFile}-wal`])
    expect((await gateway.chat('meepa', 'three')).reply).toBe('pong')
    expect(JSON.stringify(await gateway.healthz())).toMatch(/^{"status":200/)
    await gateway.stop()
    expect(runs().map((run) => run.status)).toContain('ok')
  })

  it('a full disk: the message still gets its answer, /healthz says degraded (503) "disk full" until space is back', async () => {
    llm.setDefault({text: 'pong'})
    const {home, serve} = await setup()
    // the home on a small tmpfs of its own, filled while the gateway serves
    const mounted = path.join(home.home, 'small')
    fs.mkdirSync(mounted)
    await execa('mount', ['-t', 'tmpfs', '-o', 'size=64m', 'tmpfs', mounted])
    cleanups.push(async () => void (await execa('umount', ['-l', mounted], {reject: false})))
    const smallHome = path.join(mounted, 'home')
    fs.mkdirSync(smallHome)
    fs.copyFileSync(path.join(home.home, 'config.yaml'), path.join(smallHome, 'config.yaml'))
    const port = await freePort()
    const config = fs.readFileSync(path.join(smallHome, 'config.yaml'), 'utf8').replace(/port: \d+/, `port: ${port}`)
    fs.writeFileSync(path.join(smallHome, 'config.yaml'), config)
    const gateway = await startServe({home: smallHome, port})
    cleanups.push(async () => void (gateway.process.exitCode === null && (await gateway.stop())))
    expect((await gateway.chat('meepa', 'one')).reply).toBe('pong')
    expect(JSON.stringify(await gateway.healthz())).toMatch(/^{"status":200/)
    const filler = path.join(mounted, 'filler')
    await execa('dd', ['if=/dev/zero', `of=${filler}`, 'bs=1M'], {reject: false})
    const answered = await gateway.chat('meepa', 'two')
    expect(answered.status).not.toBe(500) // a reply (or the run's own failure), never "internal error"
    const health = await gateway.healthz()
    expect(health.status).toBe(503)
    expect(health.body.status).toBe('degraded')
    expect(health.body.reasons?.join('\n')).toMatch(/disk full/)
    fs.rmSync(filler)
    expect((await gateway.chat('meepa', 'three')).reply).toBe('pong')
    expect(JSON.stringify(await gateway.healthz())).toMatch(/^{"status":200/)
    void serve
  })
})

describe('runs a crashed gateway left', () => {
  it('after serve is SIGKILLed mid-run, the next start-up tells the user in their thread, once', async () => {
    llm.setDefault((request) =>
      lastUserMessage(request).includes('slow') ? {text: 'too late', delayMs: 60_000} : {text: 'pong'},
    )
    const {chat, serve, runs} = await setup({meepachat: true})
    const first = await serve()
    await chat!.waitForReadyCount(1)
    chat!.userSays({channelId: 'general', threadId: 'parent-1', content: 'a slow question'})
    for (let i = 0; i < 100 && llm.requests.length === 0; i++) await new Promise((resolve) => setTimeout(resolve, 100))
    expect(llm.requests.length).toBeGreaterThan(0)
    first.process.kill('SIGKILL')
    await first.process
    expect(runs().map((run) => run.status)).toEqual(['running'])

    const second = await serve(first.apiKey)
    const [notice] = await chat!.waitForPosts(1, 20_000)
    expect(notice).toMatchObject({channelId: 'general', threadId: 'parent-1'})
    expect(notice?.content).toMatch(RESTARTED)
    for (let i = 0; i < 50 && runs()[0]?.delivery !== 'delivered'; i++)
      await new Promise((resolve) => setTimeout(resolve, 100))
    const [record] = runs()
    expect(record?.status).toBe('interrupted')
    expect(record?.restart_reply).toMatch(/^queued \d{4}-/)
    expect(record?.delivery).toBe('delivered')
    await second.stop()

    // a third start-up does not say it again
    const third = await serve(first.apiKey)
    await chat!.waitForReadyCount(3)
    await new Promise((resolve) => setTimeout(resolve, 1500))
    expect(chat!.posts.filter((post) => RESTARTED.test(post.content))).toHaveLength(1)
    await third.stop()
  }, 60_000)
})

describe('a damaged memory.db', () => {
  it('is named, moved aside as memory.db.corrupt-<time> and recreated, and the agent answers', async () => {
    llm.setDefault({text: 'pong'})
    const {home} = await setup()
    const first = await runCli(['send', '--agent', 'meepa', 'hello'], {home: home.home})
    expect(first.exitCode).toBe(0)
    const memory = path.join(home.workspace('meepa'), 'memory.db')
    fs.writeFileSync(memory, 'not a database at all '.repeat(400))
    const result = await runCli(['send', '--agent', 'meepa', 'hello again'], {home: home.home})
    expect(result.exitCode, result.stderr).toBe(0)
    expect(result.stdout).toContain('pong')
    expect(result.stderr).toContain(memory)
    expect(result.stderr).toMatch(/moved it to .*memory\.db\.corrupt-/)
    const [aside] = fs
      .readdirSync(home.workspace('meepa'))
      .filter((name) => name.startsWith('memory.db.corrupt-') && !/-(wal|shm)$/.test(name))
    expect(fs.readFileSync(path.join(home.workspace('meepa'), aside as string), 'utf8')).toContain(
      'not a database at all',
    )
    // the new one is a working database holding this turn
    const db = new Database(memory, {readonly: true})
    expect((db.prepare('SELECT count(*) AS n FROM history').get() as {n: number}).n).toBeGreaterThan(0)
    db.close()
  })
})
