import Database from 'better-sqlite3'
import {execa} from 'execa'
import fs from 'node:fs'
import path from 'node:path'
import {afterAll, beforeAll, expect, it} from 'vitest'
import {startFakeLlm, type FakeLlm} from '../fakes/llm-server.js'
import {startFakeMeepaChat, type FakeMeepaChat} from '../fakes/meepachat-server.js'
import {shellScripted} from '../helpers/fake-llm-for-tests.js'
import {waitFor} from '../helpers/wait-for.js'
import {freePort} from '../helpers/free-port.js'
import {BIN, fakeLlmConfig, makeHome, runCli, type TestHome} from '../helpers/home.js'
import {startServe, type ServeProcess} from '../helpers/serve.js'
import {BASE_IMAGE, describeWithDocker, homeContainersArgs} from '../helpers/docker-env.js'
import {startOwnEngine, type OwnEngine} from '../helpers/own-engine.js'
import {homeLabel} from '../../src/sandbox/docker/home-label.js'
import {syncVolumePrefix} from '../../src/runtime/container/engine-state.js'
import {openBrowser} from '../runtime/captain/browser.js'

/*
 * The `container` commands and the start-up reclaim against a remote engine: a second dockerd of
 * the test's own over tcp://127.0.0.1 with mutual TLS, the `remote` engine of a gateway served by
 * bin/run.js. `container clean` only ever runs with `--engine remote`: the shared local engine is
 * never cleaned.
 */

const TOKEN = '11.meepa-secret'
const RESTARTED = /I was restarted before I finished/

describeWithDocker('container commands and crash reclaim on a remote engine (own engine, mutual TLS)', () => {
  let engine: OwnEngine
  let llm: FakeLlm
  let chat: FakeMeepaChat
  let home: TestHome
  let port: number
  let serve: (ServeProcess & {apiKey: string}) | undefined
  const workspace = (agent: string) => path.join(home.home, 'agents', agent)
  const cli = async (...args: string[]) => runCli(['container', ...args], {home: home.home, timeoutMs: 600_000})
  const json = async (...args: string[]) => {
    const result = await cli(...args, '--json')
    expect(result.exitCode, result.stderr + result.stdout).toBe(0)
    return JSON.parse(result.stdout) as {engines: Array<Record<string, unknown> & {name: string}>}
  }
  const remoteVolumes = async () => (await engine.docker(['volume', 'ls', '-q'])).stdout.split('\n').filter(Boolean)

  beforeAll(async () => {
    engine = await startOwnEngine({tls: true, port: await freePort()})
    llm = await startFakeLlm()
    llm.setDefault(shellScripted)
    chat = await startFakeMeepaChat({token: TOKEN})
    port = await freePort()
    const tls = engine.tls!
    home = makeHome(
      fakeLlmConfig(
        llm.openaiBaseUrl,
        [
          {
            id: 'far',
            container_mode: {enabled: true, network: 'none', memory_limit: '512m', engines: ['remote']},
            connectors: [{type: 'meepachat', url: chat.gatewayUrl, bot_token: TOKEN}],
          },
        ],
        {
          captain: {enabled: true, bind: '127.0.0.1', port},
          engines: [
            {name: 'remote', host: tls.host, tls: {ca: tls.ca, cert: tls.cert, key: tls.key}, max_runs: 4},
            {name: 'local', host: process.env.DOCKER_HOST || 'unix:///var/run/docker.sock'},
          ],
        },
      ),
    )
  }, 300_000)

  afterAll(async () => {
    if (serve && serve.process.exitCode === null) await serve.stop()
    await engine?.destroy()
    await llm?.close()
    await chat?.close()
    home?.cleanup()
  }, 120_000)

  it('refuses an engine name the config does not have, naming the configured ones', async () => {
    for (const command of ['status', 'images', 'clean', 'build']) {
      const result = await cli(command, '--engine', 'nowhere')
      expect(result.exitCode, command).toBe(2)
      expect(result.stderr, command).toContain('there is no engine named "nowhere"')
      expect(result.stderr, command).toContain('remote, local')
    }
  })

  it('`container build --ship` builds here and streams the image to the engine; status and images report it there', async () => {
    const before = await json('status', '--engine', 'remote')
    expect(before.engines).toHaveLength(1)
    expect(before.engines[0]).toMatchObject({
      name: 'remote',
      agents: [{agent: 'far', isolation_image: {present: false}}],
    })

    const built = await json('build', '--engine', 'remote', '--ship')
    const tag = (built.engines[0] as unknown as {images: Array<{isolation_image: {tag: string}}>}).images[0]!
      .isolation_image.tag
    expect(built.engines[0]).toMatchObject({name: 'remote', mode: 'ship', shipped: [tag]})
    // the same image, by ID, on both engines, and no temp file of it was needed
    const idOn = async (docker: (args: string[]) => Promise<{stdout: string}>) =>
      (await docker(['image', 'inspect', '--format', '{{.Id}}', tag])).stdout.trim()
    const localId = (await execa('docker', ['image', 'inspect', '--format', '{{.Id}}', tag])).stdout.trim()
    expect(await idOn(engine.docker)).toBe(localId)

    // a second build ships nothing
    const again = await json('build', '--engine', 'remote', '--ship')
    // (unless a suite of another checkout rebuilt the tag on the shared local engine meanwhile)
    const localNow = (await execa('docker', ['image', 'inspect', '--format', '{{.Id}}', tag])).stdout.trim()
    if (localNow === localId) expect(again.engines[0]).toMatchObject({shipped: []})
    expect(await idOn(engine.docker)).toBe(localNow)

    const status = await json('status', '--engine', 'remote')
    expect(status.engines[0]).toMatchObject({
      name: 'remote',
      agents: [{agent: 'far', isolation_image: {tag, present: true, up_to_date: true}}],
      containers: [],
    })
    // every engine without --engine: the local one too, each by name
    const both = await json('status')
    expect(both.engines.map((entry) => entry.name)).toEqual(['remote', 'local'])
    // an agent restricted to `remote` is not listed on `local`
    expect(both.engines[1]).toMatchObject({agents: []})

    const images = await json('images', '--engine', 'remote')
    expect((images.engines[0] as unknown as {images: Array<{repository: string; tag: string}>}).images).toEqual(
      expect.arrayContaining([expect.objectContaining({tag: tag.split(':').at(-1)})]),
    )
  }, 900_000)

  it("`container clean --engine remote` removes only this home's objects there, keeps a volume a standby holds", async () => {
    serve = await startServe({home: home.home, port})
    fs.mkdirSync(workspace('far'), {recursive: true})
    fs.writeFileSync(path.join(workspace('far'), 'kept.txt'), 'host-truth')
    const first = await serve.chat('far', 'RUN: cat kept.txt')
    expect(first.reply, serve.output().slice(-3000)).toContain('host-truth')
    const own = (await remoteVolumes()).find((name) => name.endsWith('-far'))
    expect(own).toBeDefined()

    // another home's and the operator's objects on the same engine
    await engine.docker(['volume', 'create', 'meepa-ws-0123456789ab-far'])
    await engine.docker(['volume', 'create', 'operators-data'])
    const exited = (labels: string[], name: string) =>
      engine.docker(['run', '--name', name, ...labels.flatMap((label) => ['--label', label]), BASE_IMAGE, 'true'])
    await exited(['meepagateway=1', 'meepagateway.home=someotherhome0000'], 'other-home-left')
    await exited(['meepagateway=1', `meepagateway.home=${homeLabel(home.home)}`, 'meepagateway.agent=far'], 'own-left')
    await exited([], 'operators-container')

    const dry = await json('clean', '--engine', 'remote', '--dry-run')
    expect(dry.engines[0]).toMatchObject({volumes: [{name: own, agent: 'far'}]})
    expect(await remoteVolumes()).toContain(own)

    // the serving gateway's standby for `far` holds its volume: kept, saying so
    const cleaned = await json('clean', '--engine', 'remote')
    expect(cleaned.engines[0]).toMatchObject({
      name: 'remote',
      volumes: [],
      kept_volumes: [{name: own, reason: expect.stringMatching(/in use/)}],
      containers: [expect.objectContaining({name: 'own-left'})],
    })
    // only untagged leftovers of this home's own (a re-shipped tag leaves the old image untagged)
    for (const image of (cleaned.engines[0] as unknown as {images: Array<{ref: string}>}).images)
      expect(image.ref).toMatch(/^sha256:/)
    expect((cleaned.engines[0] as unknown as {kept: Array<{reason: string}>}).kept).toEqual([
      // by the agent's config, or by the standby container waiting for its next message
      expect.objectContaining({reason: expect.stringMatching(/^used by (agent far|1 container)/)}),
    ])
    const volumes = await remoteVolumes()
    expect(volumes).toEqual(expect.arrayContaining(['meepa-ws-0123456789ab-far', 'operators-data']))
    const containers = (await engine.docker(['ps', '-a', '--format', '{{.Names}}'])).stdout
    expect(containers).toContain('other-home-left')
    expect(containers).toContain('operators-container')
    expect(containers).not.toContain('own-left')
    expect((await engine.docker(['image', 'inspect', BASE_IMAGE])).exitCode).toBe(0)

    // the volume is made again from the host's workspace, whole
    const next = await serve.chat('far', 'RUN: cat kept.txt')
    expect(next.reply, serve.output().slice(-3000)).toContain('host-truth')
    expect(fs.readFileSync(path.join(workspace('far'), 'kept.txt'), 'utf8')).toBe('host-truth')

    // once nothing holds it, the volume goes, and with it its disk image: detached on the engine, removed
    await serve.stop()
    const disk = JSON.parse(
      fs.readFileSync(path.join(home.home, 'cache', 'engine-sync', 'remote', 'far.disk.json'), 'utf8'),
    ) as {image: string}
    const attached = async () => (await execa('losetup', ['-l', '-n', '-O', 'BACK-FILE'])).stdout
    expect(await attached()).toContain(disk.image)
    const all = await json('clean', '--engine', 'remote')
    expect(all.engines[0]).toMatchObject({volumes: [{name: own, agent: 'far'}], kept_volumes: []})
    expect(await remoteVolumes()).not.toContain(own)
    expect((await remoteVolumes()).filter((name) => name.startsWith('meepa-disks-'))).toEqual([])
    expect(await attached()).not.toContain(disk.image)
    // serving again for the next test, connected to the chat (the first serve of this file was one)
    serve = await startServe({home: home.home, port})
    await chat.waitForReadyCount(2)
  }, 300_000)

  // a mount and pid namespace of its own for the other machine: root, as CI runs
  it.runIf(process.getuid?.() === 0)(
    "another machine's gateway whose home has the same path, on the same engine, takes none of this home's objects",
    async () => {
      if (!serve || serve.process.exitCode !== null) serve = await startServe({home: home.home, port})
      expect((await serve.chat('far', 'RUN: cat kept.txt')).reply, serve.output().slice(-3000)).toContain('host-truth')
      const ownContainers = async () =>
        (await engine.docker(homeContainersArgs(home.home))).stdout.split('\n').filter(Boolean)
      // this gateway's standby waits there, running; beside it, a container of its own left behind
      await waitFor('a standby running on the remote engine', async () =>
        (await ownContainers()).some((name) => name.startsWith('meepa-standby_')),
      )
      await engine.docker([
        'run',
        '--name',
        'first-home-left',
        '--label',
        'meepagateway=1',
        '--label',
        `meepagateway.home=${homeLabel(home.home)}`,
        BASE_IMAGE,
        'true',
      ])
      const before = await ownContainers()
      const volumes = (await remoteVolumes()).filter((name) => name.startsWith('meepa-'))
      expect(volumes).toContain(`${syncVolumePrefix(homeLabel(home.home))}far`)
      // the other machine: its own home mounted at this home's path, its own processes (this
      // gateway's pid is not alive there), the same config and engine
      const other = makeHome(fs.readFileSync(home.configPath, 'utf8'))
      try {
        const result = await execa(
          'unshare',
          [
            '--mount',
            '--pid',
            '--fork',
            '--mount-proc',
            'sh',
            '-c',
            'mount --bind "$1" "$2" && shift 2 && exec "$@"',
            'sh',
          ].concat([
            other.home,
            home.home,
            process.execPath,
            BIN,
            'container',
            'clean',
            '--engine',
            'remote',
            '--json',
          ]),
          {env: {MEEPAGATEWAY_HOME: home.home}, reject: false, timeout: 300_000},
        )
        expect(result.exitCode, result.stderr + result.stdout).toBe(0)
        expect(JSON.parse(result.stdout).engines[0]).toMatchObject({volumes: [], kept_volumes: [], containers: []})
        // its id is its own, kept in its home, not this one's
        const otherId = fs.readFileSync(path.join(other.home, 'install-id'), 'utf8')
        expect(otherId).not.toBe(fs.readFileSync(path.join(home.home, 'install-id'), 'utf8'))
      } finally {
        other.cleanup()
      }
      expect(await ownContainers()).toEqual(expect.arrayContaining(before))
      expect(await remoteVolumes()).toEqual(expect.arrayContaining(volumes))
      await engine.docker(['rm', '-f', 'first-home-left'])
      // and this gateway's standby still serves its next message
      const next = await serve.chat('far', 'RUN: cat kept.txt')
      expect(next.reply, serve.output().slice(-3000)).toContain('host-truth')
    },
    300_000,
  )

  it('a gateway SIGKILLed mid-run with its keeper: the next start-up removes the container from the remote engine and tells the user', async () => {
    if (!serve || serve.process.exitCode !== null) serve = await startServe({home: home.home, port})
    await chat.waitForReadyCount(1)
    const asked = llm.requests.length
    chat.userSays({channelId: 'general', threadId: 'parent-1', content: 'RUN: sleep 120'})
    // the run under way (it asked for its command): an earlier run's record is gone by then
    await waitFor('the run asking for its command', async () => llm.requests.length > asked, 60_000)
    const record = () => {
      const db = new Database(path.join(home.home, 'gateway.db'), {readonly: true})
      try {
        return db.prepare('SELECT keeper_pid, container, engine FROM run_processes').all() as Array<{
          keeper_pid: number
          container: string
          engine: string | null
        }>
      } finally {
        db.close()
      }
    }
    const running = async (name: string) =>
      (await engine.docker(['ps', '-q', '--filter', `name=^${name}$`])).stdout.trim() !== ''
    const alive = (pid: number) => {
      try {
        process.kill(pid, 0)
        return true
      } catch {
        return false
      }
    }
    // the run's record: its keeper alive and its container running there (a standby's may be beside it)
    const row = await waitFor(
      'the run recorded, its container running on the remote engine',
      async () => {
        for (const recorded of record())
          if (alive(recorded.keeper_pid) && (await running(recorded.container))) return recorded
        return false
      },
      30_000,
    )
    expect(JSON.parse(row.engine!)).toMatchObject({name: 'remote'})
    const onEngine = async () =>
      (await engine.docker(['ps', '-aq', '--filter', `name=^${row.container}$`])).stdout.trim()
    // a kill of everything: the keeper that would remove the container goes first
    process.kill(row.keeper_pid, 'SIGKILL')
    serve.process.kill('SIGKILL')
    await serve.process
    expect(await onEngine()).not.toBe('')

    serve = await startServe({home: home.home, port, apiKey: serve.apiKey})
    await serve.waitForOutput(/removed container \S+ of run \S+ from engine remote/, 30_000)
    expect(await onEngine()).toBe('')
    const notice = (await chat.waitForPosts(1, 30_000)).find((post) => RESTARTED.test(post.content))
    expect(notice).toMatchObject({channelId: 'general', threadId: 'parent-1'})
    expect(record()).toEqual([])
    // and the agent's next run there starts from the host's copy
    fs.writeFileSync(path.join(workspace('far'), 'after.txt'), 'after-crash')
    expect((await serve.chat('far', 'RUN: cat after.txt kept.txt')).reply).toContain('after-crash')
  }, 300_000)

  it('the dashboard shows each engine: health, active runs, standbys and version; a dead one as down', async () => {
    if (!serve || serve.process.exitCode !== null) serve = await startServe({home: home.home, port})
    const admin = JSON.parse(
      (await runCli(['api-key', 'create', 'dash', '--admin', '--json'], {home: home.home})).stdout,
    ) as {key: string}
    const engines = async () => {
      const response = await fetch(`http://127.0.0.1:${port}/api/captain/engines`, {
        headers: {authorization: `Bearer ${admin.key}`},
      })
      expect(response.status).toBe(200)
      return (await response.json()) as Array<Record<string, unknown>>
    }
    // a chat key is not enough
    const refused = await fetch(`http://127.0.0.1:${port}/api/captain/engines`, {
      headers: {authorization: `Bearer ${serve.apiKey}`},
    })
    expect(refused.status).toBe(403)
    const version = (await engine.docker(['version', '--format', '{{.Server.Version}}'])).stdout.trim()
    const up = await waitFor(
      'both engines answering',
      async () => {
        const listed = await engines()
        return listed.every((entry) => entry.health === 'up') && listed
      },
      20_000,
    )
    expect(up).toEqual([
      // a standby the last run left on the remote engine may be waiting there
      {name: 'remote', health: 'up', active_runs: 0, max_runs: 4, standbys: expect.any(Number), version},
      expect.objectContaining({name: 'local', health: 'up', active_runs: 0, standbys: 0}),
    ])
    // the Overview page shows the same, one row per engine
    const link = JSON.parse((await runCli(['dashboard', 'link', '--json'], {home: home.home})).stdout) as {url: string}
    const browser = await openBrowser()
    try {
      await browser.page.goto(link.url)
      await browser.page.waitForSelector('#engines-table tr[data-engine="remote"]')
      const row = await browser.page.textContent('#engines-table tr[data-engine="remote"]')
      expect(row).toContain('up')
      expect(row).toContain('0 of 4')
      expect(row).toContain(version)
      expect(await browser.page.textContent('#engines-table tr[data-engine="local"]')).toContain('up')
      await browser.screenshot('captain-engines')
    } finally {
      await browser.close()
    }
    // a run in flight counts on its engine
    const running = serve.chat('far', 'RUN: sleep 4 && echo slept')
    await waitFor('the run counted on remote', async () => (await engines())[0]!.active_runs === 1, 20_000)
    expect((await running).reply).toContain('slept')
    // the reply goes out before the container's teardown, which the count waits for
    await waitFor('the run no longer counted', async () => (await engines())[0]!.active_runs === 0, 20_000)
    // a dead engine is shown down, with why and since when
    await engine.kill()
    const down = await waitFor(
      'remote shown down',
      async () => {
        const [remote] = await engines()
        return remote!.health === 'down' && remote
      },
      20_000,
    )
    expect(down).toMatchObject({problem: expect.any(String), down_since: expect.any(String)})
    await engine.restart()
    await waitFor('remote up again', async () => (await engines())[0]!.health === 'up', 30_000)
  }, 300_000)
})
