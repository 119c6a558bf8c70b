import Database from 'better-sqlite3'
import fs from 'node:fs'
import path from 'node:path'
import {afterAll, beforeAll, expect, it} from 'vitest'
import {startFakeLlm, type FakeLlm} from '../../fakes/llm-server.js'
import {shellScripted} from '../../helpers/fake-llm-for-tests.js'
import {freePort} from '../../helpers/free-port.js'
import {fakeLlmConfig, makeHome, type TestHome} from '../../helpers/home.js'
import {startServe, type ServeProcess} from '../../helpers/serve.js'
import {homeLabel} from '../../../src/sandbox/docker/home-label.js'
import {containerNameFor} from '../../../src/sandbox/docker/run-args.js'
import {describeWithDocker} from '../../helpers/docker-env.js'
import {startOwnEngine, type OwnEngine} from '../../helpers/own-engine.js'

/*
 * A hung or dying Docker engine, injected into an engine of the test's own (kill -STOP / -KILL
 * of its dockerd): `serve` from bin/run.js must keep every deadline (timeout_seconds + 5 s),
 * free the run's slot, tell the truth, and remove what it left once the engine answers again.
 */

const TIMEOUT_SECONDS = 6
const DEADLINE_MS = (TIMEOUT_SECONDS + 5) * 1000
const ENGINE_HUNG =
  'the Docker engine did not answer; the container may still be running and will be removed when the engine answers'

describeWithDocker('a hung or dying Docker engine under a running gateway (own engine)', () => {
  let engine: OwnEngine
  let llm: FakeLlm
  let home: TestHome
  let serve: (ServeProcess & {apiKey: string}) | undefined
  let port: number

  const containers = async (...filters: string[]) =>
    (
      await engine.docker([
        'ps',
        '-a',
        '--format',
        '{{.Names}} {{.Label "meepagateway.run"}} {{.State}}',
        '--filter',
        `label=meepagateway.home=${homeLabel(home.home)}`,
        ...filters.flatMap((filter) => ['--filter', filter]),
      ])
    ).stdout
      .split('\n')
      .filter(Boolean)
  const until = async (what: string, check: () => Promise<boolean> | boolean, timeoutMs = 30_000) => {
    const deadline = Date.now() + timeoutMs
    while (!(await check())) {
      if (Date.now() > deadline)
        throw new Error(`${what}: not within ${timeoutMs} ms; serve said:\n${serve?.output().slice(-3000)}`)
      await new Promise((resolve) => setTimeout(resolve, 200))
    }
  }
  /** Resolves once the agent's run asked the LLM for `content`: its container is up and running agent-run. */
  const runStarted = (content: string) =>
    until(`a run of "${content}" reached the LLM`, () =>
      llm.requests.some((request) => JSON.stringify(request.body.messages).includes(content)),
    )
  const record = (runId: string) => {
    const db = new Database(path.join(home.home, 'gateway.db'), {readonly: true})
    try {
      return db.prepare('SELECT * FROM runs WHERE id = ?').get(runId) as
        {status: string; error_code: string; error_message: string} | undefined
    } finally {
      db.close()
    }
  }
  const runIdOf = (reply: string) => /\(ref (run_[0-9a-f]+)\)/.exec(reply)?.[1]

  beforeAll(async () => {
    engine = await startOwnEngine()
    llm = await startFakeLlm()
    llm.setDefault(shellScripted)
    port = await freePort()
    const containerAgent = (id: string, standby: boolean) => ({
      id,
      container_mode: {enabled: true, network: 'host', memory_limit: '512m', timeout_seconds: TIMEOUT_SECONDS, standby},
    })
    home = makeHome(
      fakeLlmConfig(
        llm.openaiBaseUrl,
        [
          containerAgent('boxed', false),
          containerAgent('warm', true),
          // its image (the same base, named explicitly) has not been checked by this gateway yet
          {
            id: 'fresh',
            container_mode: {...containerAgent('fresh', false).container_mode, image: 'debian:bookworm-slim'},
          },
          {id: 'quick', file_access: {unrestricted: true}},
        ],
        {
          gateway: {max_concurrent_runs: 1, shutdown_grace_seconds: 3},
          captain: {enabled: true, bind: '127.0.0.1', port},
        },
      ),
    )
    serve = await startServe({home: home.home, port, env: engine.env})
    // the first message builds the isolation image in the test's engine
    const first = await serve.chat('boxed', 'hello')
    expect(first.reply).toBe('pong')
  }, 600_000)

  afterAll(async () => {
    if (serve && serve.process.exitCode === null) await serve.stop()
    await engine?.destroy()
    await llm?.close()
    home?.cleanup()
  }, 120_000)

  it('a run whose engine stops ends within timeout + 5 s, frees its slot, says what happened, and its container goes once the engine answers', async () => {
    const chat = serve!.chat('boxed', 'RUN: sleep 3; echo in-container')
    await runStarted('RUN: sleep 3; echo in-container')
    engine.stop()
    const sentAt = Date.now()
    // max_concurrent_runs: 1 — this one waits for the stuck run's slot
    const behind = serve!.chat('quick', 'are you there?')
    const stuck = await chat
    expect(stuck.ms).toBeLessThan(DEADLINE_MS)
    expect(stuck.status).toBe(502)
    expect(stuck.reply).toMatch(/Docker engine stopped answering/)
    const answered = await behind
    expect(answered.reply).toBe('pong')
    expect(Date.now() - sentAt).toBeLessThan(DEADLINE_MS)

    const runId = runIdOf(stuck.reply) as string
    expect(record(runId)).toMatchObject({status: 'failed', error_code: 'E_DOCKER_HUNG'})
    expect(record(runId)?.error_message).toContain(ENGINE_HUNG)
    const health = await serve!.healthz()
    expect(health.status).toBe(503)
    expect(health.body.status).toBe('degraded')
    expect(health.body.reasons?.join('\n')).toMatch(/engine down/)

    engine.resume()
    await until('the left container is removed', async () => (await containers()).length === 0)
    // the engine has removed it a moment before the gateway's removal call returns and logs
    await until('the gateway says it removed the left container', () =>
      /the Docker engine answers again: removed container meepa-run_/.test(serve!.output()),
    )
    await until('/healthz is ok again', async () => (await serve!.healthz()).status === 200)
  }, 120_000)

  it('the same with a standby container: the message it was waiting for ends within timeout + 5 s', async () => {
    expect((await serve!.chat('warm', 'hello')).reply).toBe('pong')
    await until(
      'a standby container waits',
      async () => (await containers('label=meepagateway.run=standby', 'status=running')).length === 1,
    )
    engine.stop()
    const stuck = await serve!.chat('warm', 'RUN: echo from-standby')
    expect(stuck.ms).toBeLessThan(DEADLINE_MS)
    expect(stuck.status).toBe(502)
    expect(record(runIdOf(stuck.reply) as string)).toMatchObject({status: 'failed', error_code: 'E_DOCKER_HUNG'})
    engine.resume()
    await until('every container of the run is removed', async () => (await containers()).length === 0)
  }, 120_000)

  it('a message whose image must first be checked: failed within timeout + 5 s, nothing started', async () => {
    engine.stop()
    const stuck = await serve!.chat('fresh', 'hello')
    engine.resume()
    expect(stuck.ms).toBeLessThan(DEADLINE_MS)
    expect(stuck.status).toBe(502)
    const failed = record(runIdOf(stuck.reply) as string)
    expect(failed).toMatchObject({status: 'failed', error_code: 'E_DOCKER_HUNG'})
    expect(failed?.error_message).toMatch(/the Docker engine did not answer; nothing was started/)
    await until('/healthz is ok once the engine answers', async () => (await serve!.healthz()).status === 200)
    expect(await containers()).toEqual([])
  }, 60_000)

  it('SIGTERM to serve with a hung engine, a run and a standby: stops within the 3 s grace + 5 s; the next start-up removes what was left', async () => {
    expect((await serve!.chat('warm', 'hello')).reply).toBe('pong')
    await until(
      'a standby container waits',
      async () => (await containers('label=meepagateway.run=standby', 'status=running')).length === 1,
    )
    const chat = serve!.chat('boxed', 'RUN: sleep 30')
    await runStarted('RUN: sleep 30')
    engine.stop()
    const {ms, exitCode} = await serve!.stop()
    expect(ms, serve!.output()).toBeLessThan(8000)
    expect(exitCode, serve!.output()).toBe(0)
    expect((await chat).reply).toMatch(/restarted before I finished/)
    engine.resume()
    expect(await containers()).not.toEqual([])
    serve = await startServe({home: home.home, port, env: engine.env, apiKey: serve!.apiKey})
    await until('the next start-up removed the left container', async () => (await containers()).length === 0)
    // the engine has removed them a moment before the gateway's call returns and logs
    await until('the gateway says it removed what was left', () =>
      /removed [12] container\(s\) left behind by a previous gateway/.test(serve!.output()),
    )
  }, 120_000)

  it("/healthz asks the engine itself, with no run: a stopped engine is named at once, in the CLI's words, and ok once it answers", async () => {
    await until('/healthz ok', async () => (await serve!.healthz()).status === 200)
    engine.stop()
    let health = await serve!.healthz()
    await until('/healthz degraded without a run', async () => (health = await serve!.healthz()).status === 503, 15_000)
    expect(health.body.status).toBe('degraded')
    expect(health.body.reasons).toEqual([
      expect.stringMatching(
        /^engine down: the Docker engine did not answer GET \/_ping within 3 s; it seems hung \(since [0-9T:.-]+Z\)$/,
      ),
    ])
    engine.resume()
    await until('/healthz ok once the engine answers', async () => (await serve!.healthz()).status === 200, 15_000)
  }, 60_000)

  it("serve stopped (SIGSTOP) past a container run's deadline: the container ends itself, nothing it would write later appears", async () => {
    const chat = serve!.chat('boxed', 'RUN: sleep 13; touch /workspace/AFTER_DEADLINE')
    await runStarted('RUN: sleep 13; touch /workspace/AFTER_DEADLINE')
    const stoppedAt = Date.now()
    serve!.process.kill('SIGSTOP')
    try {
      // agent-run ends itself 2 s past the 6 s deadline; the keeper removes the container 5 s past it
      await until(
        "the run's container to stop while serve is stopped",
        async () => (await containers('label=meepagateway.agent=boxed', 'status=running')).length === 0,
        15_000,
      )
      expect(Date.now() - stoppedAt).toBeLessThan((TIMEOUT_SECONDS + 5) * 1000)
      await new Promise((resolve) => setTimeout(resolve, 15_000 - (Date.now() - stoppedAt)))
    } finally {
      serve!.process.kill('SIGCONT')
    }
    expect(fs.existsSync(path.join(home.workspace('boxed'), 'AFTER_DEADLINE'))).toBe(false)
    const {reply} = await chat
    expect(reply).toMatch(/^Sorry, I was paused when this message's time ran out/)
    await until("the run's container is removed", async () => (await containers()).length === 0)
  }, 90_000)

  it('an engine that dies mid-message is reported as such, not as a container that never started', async () => {
    const chat = serve!.chat('boxed', 'RUN: sleep 4; echo after')
    await runStarted('RUN: sleep 4; echo after')
    await engine.kill()
    const died = await chat
    expect(died.ms).toBeLessThan(DEADLINE_MS)
    // the user hears that part of it may have run
    expect(died.reply).toMatch(
      /^Sorry, I couldn't finish: the Docker engine stopped answering while I was working, so I was stopped, and part of the work may already have run\./,
    )
    const failed = record(runIdOf(died.reply) as string)
    expect(failed?.error_message).not.toMatch(/before the container started/)
    expect(failed?.error_message).toMatch(/stopped answering during the run|did not answer/)
    expect(failed?.error_message).toMatch(/may have partly run/)
    expect(failed?.error_message).toMatch(/will be removed when the engine answers/)
    let health = await serve!.healthz()
    expect(health.status).toBe(503)
    // short and clean: the reason the docker CLI gives, without its "See 'docker run --help'"
    await until(
      'the engine probe names the dead engine',
      async () =>
        /^engine down: the Docker engine is not running or not reachable/.test(
          (health = await serve!.healthz()).body.reasons?.[0] ?? '',
        ),
      15_000,
    )
    expect(health.body.reasons).toEqual([
      expect.stringMatching(
        /^engine down: the Docker engine is not running or not reachable at DOCKER_HOST=unix:\/\/\S+: Cannot connect to the Docker daemon at unix:\/\/\S+\. Is the docker daemon running\?( \((ECONNREFUSED|ENOENT)\))? \(since [0-9T:.-]+Z\)$/,
      ),
    ])
    expect(health.body.reasons?.[0]).not.toMatch(/\||--help/)

    // the engine comes back: what the run left is removed before anything else starts there
    const restartedAt = Math.floor(Date.now() / 1000)
    await engine.restart()
    // a freshly restarted engine on a busy machine can be slower than the 6 s run timeout at first
    await until('/healthz ok again', async () => (await serve!.healthz()).status === 200, 15_000)
    const next = await serve!.chat('boxed', 'hello again')
    expect(next.reply, serve!.output().slice(-4000)).toBe('pong')
    const deadRunContainer = containerNameFor(runIdOf(died.reply) as string)
    expect(serve!.output()).toContain(`the Docker engine answers again: removed container ${deadRunContainer}`)
    const events = (
      await engine.docker([
        'events',
        '--since',
        String(restartedAt),
        '--until',
        String(Math.ceil(Date.now() / 1000)),
        '--filter',
        'type=container',
        '--format',
        '{{.Action}} {{.Actor.Attributes.name}}',
      ])
    ).stdout.split('\n')
    const removed = events.indexOf(`destroy ${deadRunContainer}`)
    expect(removed, events.join('\n')).toBeGreaterThanOrEqual(0)
    expect(
      events.findIndex((event) => event.startsWith('create ')),
      events.join('\n'),
    ).toBeGreaterThan(removed)
    await until('nothing of the dead run is left', async () => (await containers()).length === 0)
  }, 180_000)
})
