import {execa} from 'execa'
import fs from 'node:fs'
import path from 'node:path'
import YAML from 'yaml'
import {afterAll, beforeAll, expect, it} from 'vitest'
import {startFakeLlm, type FakeLlm} from '../../../fakes/llm-server.js'
import {shellScripted} from '../../../helpers/fake-llm-for-tests.js'
import {waitFor} from '../../../helpers/wait-for.js'
import {freePort} from '../../../helpers/free-port.js'
import {fakeLlmConfig, makeHome, type TestHome} from '../../../helpers/home.js'
import {startServe, type ServeProcess} from '../../../helpers/serve.js'
import {describeWithDocker, tempDir} from '../../../helpers/docker-env.js'
import {startOwnEngine, type OwnEngine} from '../../../helpers/own-engine.js'
import {expectNoKeyOnEngine, healthzNamesDown, inAgentVolume, lastEngineOf} from '../../../helpers/engine-scan.js'
import {startOwnSshd, type OwnSshd} from '../../../helpers/own-sshd.js'
import {loadConfig} from '../../../../src/runtime/config/load.js'
import {runMessage} from '../../../../src/runtime/runners/run-message.js'
import {enginesOf, stopWatchingEngines} from '../../../../src/runtime/runners/container/engines.js'
import {toGatewayError} from '../../../../src/runtime/util/errors.js'

/*
 * `ssh://` and `context:` engines, on real parts: an sshd of the test's own on 127.0.0.1 whose
 * sessions' `docker` reaches a second dockerd of the test's own (own-engine.ts), and a docker
 * context (in a DOCKER_CONFIG of the test's) naming that dockerd over mutual TLS. The gateway,
 * served by bin/run.js, reaches the first through the docker CLI's ssh (host keys always checked),
 * the second as the context's host and TLS files; both keep the workspace by the sync.
 */

const KEY = 'sk-fake-test-key-123456' // what startServe gives FAKE_LLM_KEY

describeWithDocker('container runs on engines over ssh:// and through a docker context (own sshd and engine)', () => {
  let engine: OwnEngine
  let sshd: OwnSshd
  let llm: FakeLlm
  let home: TestHome
  let serve: (ServeProcess & {apiKey: string}) | undefined
  const dockerConfig = tempDir('meepa-docker-config-')
  const workspace = (agent: string) => path.join(home.home, 'agents', agent)

  const degradedNaming = (name: string) => healthzNamesDown(serve!, name)
  const lastEngine = () => lastEngineOf(serve!)
  const inVolume = (agent: string, command: string, ...args: string[]) => inAgentVolume(engine, agent, command, ...args)
  const containersOf = async (agent: string) =>
    (await engine.docker(['ps', '-a', '-q', '--filter', `label=meepagateway.agent=${agent}`])).stdout.trim()

  beforeAll(async () => {
    engine = await startOwnEngine({tls: true, port: await freePort()})
    sshd = await startOwnSshd({dockerHost: engine.host})
    const tls = engine.tls!
    await execa(
      'docker',
      ['context', 'create', 'meepa-far', '--docker', `host=${tls.host},ca=${tls.ca},cert=${tls.cert},key=${tls.key}`],
      {env: {DOCKER_CONFIG: dockerConfig}},
    )
    llm = await startFakeLlm()
    llm.setDefault(shellScripted)
    const port = await freePort()
    const agent = (id: string, engines: string[]) => ({
      id,
      container_mode: {enabled: true, network: 'none', memory_limit: '512m', timeout_seconds: 60, engines},
    })
    home = makeHome(
      fakeLlmConfig(
        llm.openaiBaseUrl,
        [agent('far', ['ssh']), agent('viactx', ['ctx']), agent('any', ['ssh', 'local'])],
        {
          captain: {enabled: true, bind: '127.0.0.1', port},
          engines: [
            {name: 'ssh', host: sshd.host, ssh: {known_hosts: sshd.knownHosts, identity: sshd.identity}, max_runs: 4},
            {name: 'ctx', context: 'meepa-far'},
            {name: 'local', host: process.env.DOCKER_HOST || 'unix:///var/run/docker.sock'},
          ],
        },
      ),
    )
    serve = await startServe({home: home.home, port, env: {DOCKER_CONFIG: dockerConfig}})
    // the first message builds the isolation image on the far engine
    const first = await serve.chat('far', 'hello')
    expect(first.reply, serve.output().slice(-3000)).toBe('pong')
  }, 900_000)

  afterAll(async () => {
    if (serve && serve.process.exitCode === null) await serve.stop()
    sshd?.destroy()
    await engine?.destroy()
    await llm?.close()
    home?.cleanup()
    fs.rmSync(dockerConfig, {recursive: true, force: true})
  }, 120_000)

  it('runs a message over ssh://: it sees the host workspace, and what it writes comes back', async () => {
    fs.writeFileSync(path.join(workspace('far'), 'seed.txt'), 'from-the-host')
    const wrote = await serve!.chat('far', 'RUN: cat seed.txt && echo made-over-ssh > note.txt && echo done')
    expect(wrote.reply, serve!.output().slice(-2000)).toContain('from-the-host')
    expect(lastEngine()).toBe('ssh')
    expect(fs.readFileSync(path.join(workspace('far'), 'note.txt'), 'utf8')).toBe('made-over-ssh\n')
    // the run's workspace was the engine-side volume, not a bind of the host path
    expect((await inVolume('far', 'ls', '-A', '/w')).stdout.split('\n')).toEqual(
      expect.arrayContaining(['seed.txt', 'note.txt']),
    )
    const next = await serve!.chat('far', 'RUN: cat note.txt')
    expect(next.reply).toContain('made-over-ssh')
  }, 120_000)

  it('runs a message through a docker context (its TLS engine), by the sync', async () => {
    fs.mkdirSync(workspace('viactx'), {recursive: true})
    fs.writeFileSync(path.join(workspace('viactx'), 'seed.txt'), 'context-seed')
    const reply = await serve!.chat('viactx', 'RUN: cat seed.txt && echo via-context > ctx.txt && echo done')
    expect(reply.reply, serve!.output().slice(-2000)).toContain('context-seed')
    expect(lastEngine()).toBe('ctx')
    expect(fs.readFileSync(path.join(workspace('viactx'), 'ctx.txt'), 'utf8')).toBe('via-context\n')
    expect((await inVolume('viactx', 'ls', '-A', '/w')).stdout.split('\n')).toContain('ctx.txt')
  }, 120_000)

  it('sends no provider key over ssh: not in the container, its environment, argv or volume', async () => {
    await expectNoKeyOnEngine(serve!, engine, 'far', KEY)
  }, 120_000)

  it('refuses a host whose ssh host key is unknown or wrong, saying so, and runs nothing there', async () => {
    const dir = tempDir('meepa-ssh-refused-')
    try {
      for (const [agentId, knownHosts, said] of [
        ['unknown', sshd.unknownHosts, /ssh host key of \[127\.0\.0\.1\]:\d+ is not known/],
        ['impostor', sshd.wrongHosts, /ssh host key of \[127\.0\.0\.1\]:\d+ does not match the known one/],
      ] as const) {
        const configPath = path.join(dir, `${agentId}.yaml`)
        fs.writeFileSync(
          configPath,
          YAML.stringify(
            fakeLlmConfig(
              llm.openaiBaseUrl,
              [{id: agentId, container_mode: {enabled: true, network: 'none', standby: false}}],
              {
                engines: [
                  {
                    name: `guarded-${agentId}`,
                    host: sshd.host,
                    ssh: {known_hosts: knownHosts, identity: sshd.identity},
                  },
                ],
              },
            ),
          ),
        )
        const loaded = loadConfig({configPath, home: dir})
        const [guarded] = enginesOf(loaded.config)
        expect(guarded!.name).toBe(`guarded-${agentId}`)
        const refused = await guarded!.ping(20_000).then(
          () => undefined,
          (error: unknown) => toGatewayError(error),
        )
        expect(refused?.message).toMatch(said)
        expect(refused?.suggestions.join(' ')).toContain('engines[].ssh.known_hosts')
        // a message for it: told the engine is not used, and nothing was started there
        process.env.FAKE_LLM_KEY = KEY
        const result = await runMessage({
          loaded,
          agentId,
          message: {id: 'm', connector: 'cli', channel_id: 'c', user: {id: 'u', name: 'u'}, content: 'RUN: echo ran'},
          onLog: () => {},
        })
        stopWatchingEngines()
        expect(result.output.ok).toBe(false)
        expect(await containersOf(agentId)).toBe('')
        expect((await engine.docker(['volume', 'ls', '-q'])).stdout).not.toContain(`-${agentId}`)
      }
    } finally {
      stopWatchingEngines()
      fs.rmSync(dir, {recursive: true, force: true})
    }
  }, 180_000)

  it('an sshd killed between runs is marked down, runs go to the local engine, and it is used again when back', async () => {
    expect((await serve!.chat('any', 'hello')).reply).toBe('pong')
    expect(lastEngine()).toBe('ssh')
    sshd.kill()
    const killedAt = Date.now()
    await waitFor('healthz naming the ssh engine down', () => degradedNaming('ssh'), 20_000)
    expect(Date.now() - killedAt).toBeLessThan(8_000)
    const elsewhere = await serve!.chat('any', 'RUN: echo on-local > local.txt && echo done')
    expect(elsewhere.reply, serve!.output().slice(-2000)).toContain('done')
    expect(lastEngine()).toBe('local')
    expect((await serve!.chat('far', 'hello')).reply).toMatch(/engine is not answering/)
    await sshd.start()
    await waitFor('healthz no longer naming it', async () => !(await degradedNaming('ssh')), 30_000)
    // back over ssh, where the local run's writes are seen
    expect((await serve!.chat('any', 'RUN: cat local.txt')).reply).toContain('on-local')
    expect(lastEngine()).toBe('ssh')
  }, 600_000)

  it('an sshd killed mid-run: the user is told the run failed, the engine comes back, nothing is left there', async () => {
    const asked = llm.requests.length
    const running = serve!.chat('far', 'RUN: sleep 20 && echo too-late > late.txt && echo finished')
    const inFlight = (
      await waitFor('the run container on the far engine', async () => (await containersOf('far')) || false, 30_000)
    ).split('\n')
    // a standby of far may be listed before the message reaches it: the run is under way once it asked
    await waitFor('the run asking for its command', async () => llm.requests.length > asked, 30_000)
    sshd.kill()
    const reply = await running
    expect(reply.reply).toMatch(/stopped answering while I was working.*part of the work may already have run/)
    expect(fs.existsSync(path.join(workspace('far'), 'late.txt'))).toBe(false)
    await sshd.start()
    await waitFor('healthz no longer naming it', async () => !(await degradedNaming('ssh')), 30_000)
    expect((await serve!.chat('far', 'RUN: echo again')).reply).toContain('again')
    // (the run that answered leaves its standby there: only the failed run's container must go)
    await waitFor(
      'no container of the failed run left on the far engine',
      async () => !(await containersOf('far')).split('\n').some((id) => inFlight.includes(id)),
      60_000,
    )
  }, 600_000)
})
