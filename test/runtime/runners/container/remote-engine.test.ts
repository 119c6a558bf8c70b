import {execa} from 'execa'
import fs from 'node:fs'
import os from 'node:os'
import path from 'node:path'
import {afterAll, beforeAll, expect, it} from 'vitest'
import {startFakeLlm, type FakeLlm} from '../../../fakes/llm-server.js'
import {shellScripted} from '../../../helpers/fake-llm-for-tests.js'
import {waitFor} from '../../../helpers/wait-for.js'
import {freePort} from '../../../helpers/free-port.js'
import {fakeLlmConfig, makeHome, type TestHome} from '../../../helpers/home.js'
import {startServe, type ServeProcess} from '../../../helpers/serve.js'
import {describeWithDocker} from '../../../helpers/docker-env.js'
import {startOwnEngine, type OwnEngine} from '../../../helpers/own-engine.js'
import {expectNoKeyOnEngine, healthzNamesDown, inAgentVolume, lastEngineOf} from '../../../helpers/engine-scan.js'
import {DockerCli} from '../../../../src/sandbox/docker/cli.js'
import {engineArgsOf} from '../../../../src/runtime/runners/container/engines.js'
import {toGatewayError} from '../../../../src/runtime/util/errors.js'

/*
 * A second dockerd of the test's own, reached over tcp://127.0.0.1 with mutual TLS (certificates
 * made with openssl here), as the `remote` engine of a gateway served by bin/run.js. It could bind
 * host paths (it is on this machine), but the runner must never ask it to: files reach the host
 * only through the workspace sync.
 */

describeWithDocker('container runs on a remote engine over mutual TLS (own engine)', () => {
  let engine: OwnEngine
  let llm: FakeLlm
  let home: TestHome
  let serve: (ServeProcess & {apiKey: string}) | undefined
  const workspace = (agent: string) => path.join(home.home, 'agents', agent)
  /** The remote dockerd is SIGSTOPped (a failed test must not leave it so for destroy). */
  let stopped = false
  const outside = fs.mkdtempSync(path.join(os.tmpdir(), 'meepa-outside-'))

  const degradedNaming = (name: string) => healthzNamesDown(serve!, name)
  const lastEngine = () => lastEngineOf(serve!)
  const inVolume = (agent: string, command: string, ...args: string[]) => inAgentVolume(engine, agent, command, ...args)
  /** The standby containers of an agent waiting on the remote engine, as its own `docker ps` lists them: "ID NAME". */
  const remoteStandbys = async (agent: string): Promise<string[]> =>
    (
      await engine.docker([
        'ps',
        '--format',
        '{{.ID}} {{.Names}}',
        '--filter',
        `label=meepagateway.agent=${agent}`,
        '--filter',
        'label=meepagateway.run=standby',
      ])
    ).stdout
      .split('\n')
      .filter(Boolean)
  /** The one standby of an agent on the remote engine, once it is there: its container id and name. */
  const remoteStandby = async (agent: string) => {
    const [line] = await waitFor(
      `a standby of ${agent} on the remote engine`,
      async () => {
        const found = await remoteStandbys(agent)
        return found.length === 1 && found
      },
      30_000,
    )
    const [id = '', name = ''] = line!.split(' ')
    return {id, name}
  }
  /** What the agent's volume on the remote engine holds. */
  const volumeFiles = async (agent: string) =>
    (await inVolume(agent, 'ls', '-A', '/w')).stdout.split('\n').filter(Boolean)

  beforeAll(async () => {
    engine = await startOwnEngine({tls: true, port: await freePort()})
    llm = await startFakeLlm()
    llm.setDefault(shellScripted)
    const port = await freePort()
    const tls = engine.tls!
    const agent = (id: string, engines?: string[]) => ({
      id,
      container_mode: {
        enabled: true,
        network: 'none',
        memory_limit: '512m',
        timeout_seconds: 60,
        ...(engines ? {engines} : {}),
      },
    })
    home = makeHome(
      fakeLlmConfig(llm.openaiBaseUrl, [agent('far', ['remote']), agent('any')], {
        captain: {enabled: true, bind: '127.0.0.1', port},
        engines: [
          {name: 'remote', host: tls.host, tls: {ca: tls.ca, cert: tls.cert, key: tls.key}, max_runs: 4},
          {name: 'local', host: process.env.DOCKER_HOST || 'unix:///var/run/docker.sock'},
        ],
      }),
    )
    serve = await startServe({home: home.home, port})
    // the first message builds the isolation image on the remote engine
    const first = await serve.chat('far', 'hello')
    expect(first.reply, serve.output().slice(-3000)).toBe('pong')
  }, 900_000)

  afterAll(async () => {
    if (stopped) engine.resume()
    if (serve && serve.process.exitCode === null) await serve.stop()
    await engine?.destroy()
    await llm?.close()
    home?.cleanup()
    fs.rmSync(outside, {recursive: true, force: true})
  }, 120_000)

  it('runs a message there: it sees the host workspace, and what it writes comes back through the sync', async () => {
    fs.writeFileSync(path.join(workspace('far'), 'seed.txt'), 'from-the-host')
    const wrote = await serve!.chat(
      'far',
      'RUN: cat seed.txt && echo made-remotely > note.txt && mkdir -p d/e && echo deep > d/e/f',
    )
    expect(wrote.reply).toContain('from-the-host')
    expect(lastEngine()).toBe('remote')
    expect(fs.readFileSync(path.join(workspace('far'), 'note.txt'), 'utf8')).toBe('made-remotely\n')
    expect(fs.readFileSync(path.join(workspace('far'), 'd/e/f'), 'utf8')).toBe('deep\n')
    // the run's workspace was the engine-side volume, not a bind of the host path
    expect(await volumeFiles('far')).toEqual(expect.arrayContaining(['seed.txt', 'note.txt', 'd']))
    // message N+1 sees message N's writes; a file removed there is removed on the host
    const next = await serve!.chat('far', 'RUN: cat note.txt && rm note.txt')
    expect(next.reply).toContain('made-remotely')
    expect(fs.existsSync(path.join(workspace('far'), 'note.txt'))).toBe(false)
    // an edit on the host (as the dashboard makes) reaches the next run
    fs.writeFileSync(path.join(workspace('far'), 'seed.txt'), 'edited-on-the-host')
    expect((await serve!.chat('far', 'RUN: cat seed.txt')).reply).toContain('edited-on-the-host')
  }, 120_000)

  it('runs the next message in a standby container waiting on that engine, on the volume as the host has it then', async () => {
    await serve!.chat('far', 'RUN: echo message-n > n.txt')
    // the standby that stays: one made a moment earlier may still be giving way to it
    const {id, name} = await waitFor(
      'one standby of far on the remote engine, the same for a second',
      async () => {
        const seen = await remoteStandby('far')
        await new Promise((resolve) => setTimeout(resolve, 1000))
        const now = await remoteStandbys('far')
        return now.length === 1 && now[0] === `${seen.id} ${seen.name}` && seen
      },
      60_000,
    )
    // the local engine holds none of it
    const local = await execa('docker', ['ps', '-q', '--filter', 'label=meepagateway.agent=far'])
    expect(local.stdout.trim()).toBe('')
    // the host changes after the standby started, as a run on another engine or the dashboard does
    const late = path.join(workspace('far'), 'late.txt')
    fs.writeFileSync(late, 'written-after-the-standby-started')
    const lateInode = fs.statSync(late).ino
    const before = serve!.output().length
    const reply = await serve!.chat('far', 'RUN: hostname && cat n.txt late.txt')
    const log = serve!.output().slice(before)
    expect(log).toContain(`running in standby container ${name}`)
    expect(reply.reply).toContain(id) // its hostname: that very container ran the message
    expect(reply.reply).toContain('message-n')
    expect(reply.reply).toContain('written-after-the-standby-started')
    // what was sent as the message came is not the run's change: it is not taken back (rewritten) again
    expect(fs.statSync(late).ino).toBe(lateInode)
  }, 120_000)

  it("never makes the agent's links, FIFOs or escapes on the host, and never writes through a planted link", async () => {
    fs.symlinkSync(outside, path.join(workspace('far'), 'planted'))
    const reply = await serve!.chat(
      'far',
      'RUN: ln -s /etc/passwd link && mkfifo fifo && mkdir -p planted && echo pwned > planted/x && echo fine > plain && echo ok',
    )
    expect(reply.reply).toContain('ok')
    expect(fs.readFileSync(path.join(workspace('far'), 'plain'), 'utf8')).toBe('fine\n')
    expect(fs.existsSync(path.join(workspace('far'), 'link'))).toBe(false)
    expect(fs.existsSync(path.join(workspace('far'), 'fifo'))).toBe(false)
    expect(fs.existsSync(path.join(outside, 'x'))).toBe(false)
    expect(fs.lstatSync(path.join(workspace('far'), 'planted')).isSymbolicLink()).toBe(true)
  }, 120_000)

  it('sends no provider key to the remote engine: not in the container, its environment, argv or volume', async () => {
    const key = 'sk-fake-test-key-123456' // what startServe gives FAKE_LLM_KEY
    await expectNoKeyOnEngine(serve!, engine, 'far', key)
  }, 120_000)

  it('refuses an engine whose certificate the CA did not sign, saying so', async () => {
    const tls = engine.tls!
    const cli = new DockerCli({
      engineArgs: engineArgsOf({
        name: 'x',
        host: tls.host,
        kind: 'docker',
        max_runs: 1,
        insecure: false,
        tls: {...tls, ca: tls.otherCa},
      }),
    })
    const error = await cli.ping({timeoutMs: 10_000}).then(
      () => undefined,
      (caught: unknown) => toGatewayError(caught),
    )
    expect(error?.message).toMatch(/TLS handshake failed.*certificate/)
    expect(error?.suggestions.join(' ')).toContain('engines[].tls.ca')
    // and with the right CA it answers
    await new DockerCli({
      engineArgs: engineArgsOf({name: 'x', host: tls.host, kind: 'docker', max_runs: 1, insecure: false, tls}),
    }).ping({timeoutMs: 10_000})
  }, 60_000)

  for (const fault of ['SIGSTOP', 'SIGKILL'] as const) {
    it(`an engine that stops answering (${fault}) is marked down, runs go to the local engine, and it is used again when back`, async () => {
      expect((await serve!.chat('any', 'hello')).reply).toBe('pong')
      expect(lastEngine()).toBe('remote')
      const standbyName = (await remoteStandby('any')).name
      if (fault === 'SIGSTOP') {
        engine.stop()
        stopped = true
      } else await engine.kill()
      const stoppedAt = Date.now()
      await waitFor('healthz naming the remote engine down', () => degradedNaming('remote'), 20_000)
      expect(Date.now() - stoppedAt).toBeLessThan(8_000)
      // its standbys are dropped with it (none waits anywhere now)
      const health = await serve!.healthz()
      const standbys = health.body.standbys as {by_level: {container?: {count: number}}}
      expect(standbys.by_level.container?.count ?? 0).toBe(0)
      // the local engine builds the image on its first run there
      const elsewhere = await serve!.chat('any', 'RUN: echo on-local > local.txt && echo done')
      expect(elsewhere.reply, serve!.output().slice(-2000)).toContain('done')
      expect(lastEngine()).toBe('local')
      // an agent allowed only the remote engine is told, not run elsewhere
      const refused = await serve!.chat('far', 'hello')
      expect(refused.reply).toMatch(/engine is not answering/)
      expect(serve!.output()).toMatch(/no engine can take the run: remote is down/)
      if (fault === 'SIGSTOP') engine.resume()
      else await engine.restart()
      stopped = false
      await waitFor('healthz no longer naming it', async () => !(await degradedNaming('remote')), 30_000)
      // the dropped standby's container is removed once the engine answers
      await waitFor(
        'the dropped standby container removed from the remote engine',
        async () => (await engine.docker(['ps', '-a', '-q', '--filter', `name=${standbyName}`])).stdout.trim() === '',
        30_000,
      )
      const beforeBack = serve!.output().length
      // back on the remote engine, which sees what the local run wrote
      expect((await serve!.chat('any', 'RUN: cat local.txt')).reply).toContain('on-local')
      expect(lastEngine()).toBe('remote')
      // not run in the dropped standby (the log may still say it was removed, after the engine did it)
      expect(serve!.output().slice(beforeBack)).not.toContain(`running in standby container ${standbyName}`)
    }, 600_000)
  }
})
