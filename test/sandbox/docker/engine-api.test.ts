import {execa} from 'execa'
import fs from 'node:fs'
import http from 'node:http'
import net from 'node:net'
import path from 'node:path'
import {afterAll, beforeAll, describe, expect, it} from 'vitest'
import {fakeLlmConfig, makeHome, runCli, type TestHome} from '../../helpers/home.js'
import {DockerCli} from '../../../src/sandbox/docker/cli.js'
import {listGatewayContainers, removeContainers} from '../../../src/sandbox/docker/containers.js'
import {homeLabel} from '../../../src/sandbox/docker/home-label.js'
import {DEFAULT_DOCKER_SOCKET, EngineApi, localEngineSocket} from '../../../src/sandbox/docker/engine-api.js'
import {labelledImages, removeImage} from '../../../src/sandbox/docker/images.js'
import {BASE_IMAGE, describeWithDocker, realDockerPath, tempDir} from '../../helpers/docker-env.js'

/*
 * The Engine API client `container status` uses on a local socket: it must answer what the docker
 * CLI answers for the same objects, fail with the CLI's errors (engine down: exit 10), and never
 * hang on an engine that accepts and does not answer.
 */

const unique = `${process.pid}-${Date.now().toString(36)}`
const LARGE_ENV = Array.from({length: 20_000}, (_, i) => `VARIABLE_${i}=${'é'.repeat(20)}`) // ≈ 1 MB, multi-byte
const docker = (args: string[]) => execa('docker', args, {reject: false, timeout: 60_000})

/** A unix socket server for the duration of a test file. */
async function listen(server: net.Server, socket: string): Promise<void> {
  await new Promise<void>((resolve) => server.listen(socket, resolve))
}

describe('which engines are asked over the API', () => {
  it('the default socket and unix:// hosts; the CLI for tcp/ssh hosts, contexts and an injected docker binary', () => {
    const home = tempDir('meepa-docker-config-')
    try {
      expect(localEngineSocket({HOME: home})).toBe(DEFAULT_DOCKER_SOCKET)
      expect(localEngineSocket({HOME: home, DOCKER_HOST: 'unix:///run/user/1000/docker.sock'})).toBe(
        '/run/user/1000/docker.sock',
      )
      expect(localEngineSocket({HOME: home, DOCKER_HOST: 'tcp://127.0.0.1:2375'})).toBeUndefined()
      expect(localEngineSocket({HOME: home, DOCKER_HOST: 'ssh://me@box'})).toBeUndefined()
      expect(localEngineSocket({HOME: home, DOCKER_CONTEXT: 'remote'})).toBeUndefined()
      expect(localEngineSocket({HOME: home, MEEPAGATEWAY_DOCKER_BIN: '/opt/fake-docker'})).toBeUndefined()
      // `docker context use` is written to the CLI's config: only the CLI knows that context's endpoint
      fs.mkdirSync(path.join(home, '.docker'))
      fs.writeFileSync(path.join(home, '.docker', 'config.json'), JSON.stringify({currentContext: 'default'}))
      expect(localEngineSocket({HOME: home})).toBe(DEFAULT_DOCKER_SOCKET)
      fs.writeFileSync(path.join(home, '.docker', 'config.json'), JSON.stringify({currentContext: 'colima'}))
      expect(localEngineSocket({HOME: home})).toBeUndefined()
      expect(localEngineSocket({HOME: '/nonexistent', DOCKER_CONFIG: path.join(home, '.docker')})).toBeUndefined()
    } finally {
      fs.rmSync(home, {recursive: true, force: true})
    }
  })
})

describe('Engine API client: deadlines, cancellation and errors', () => {
  let dir: string
  let hungServer: net.Server
  let hungSocket: string
  const held: net.Socket[] = []
  let fakeServer: http.Server
  let fakeSocket: string
  const paths: string[] = []
  let serverHeader: Record<string, string> = {}

  beforeAll(async () => {
    dir = tempDir('meepa-engine-api-')
    // An engine that accepts the connection and never answers: what a wedged dockerd looks like.
    hungSocket = path.join(dir, 'hung.sock')
    hungServer = net.createServer((socket) => held.push(socket))
    await listen(hungServer, hungSocket)
    // An engine of API 1.40 that knows one image and fails its container list.
    fakeSocket = path.join(dir, 'fake.sock')
    fakeServer = http.createServer((req, res) => {
      paths.push(req.url ?? '')
      const url = (req.url ?? '').replace(/^\/v\d+\.\d+\//, '/') // versioned or not, as the engine's router
      if (url === '/_ping') return res.writeHead(200, {'API-Version': '1.40', ...serverHeader}).end('OK')
      if (url === '/version')
        return res
          .writeHead(200, {'Content-Type': 'application/json'})
          .end(JSON.stringify({Version: '19.03.0', ApiVersion: '1.40'}))
      if (url === '/images/known:1/json')
        return res.writeHead(200).end(JSON.stringify({Id: 'sha256:abc', RepoTags: ['known:1']}))
      if (url === '/images/large:1/json')
        return res.writeHead(200).end(JSON.stringify({Id: 'sha256:large', Config: {Env: LARGE_ENV}}))
      if (url.startsWith('/containers/json'))
        return res.writeHead(500).end(JSON.stringify({message: 'the list is broken'}))
      res.writeHead(404).end(JSON.stringify({message: 'no such image'}))
    })
    await listen(fakeServer, fakeSocket)
  })
  afterAll(async () => {
    for (const socket of held) socket.destroy()
    await new Promise((resolve) => hungServer.close(resolve))
    fakeServer.closeAllConnections()
    await new Promise((resolve) => fakeServer.close(resolve))
    fs.rmSync(dir, {recursive: true, force: true})
  })

  it('speaks the engine\'s own API version (unversioned paths) unless DOCKER_API_VERSION pins one, and reads 404 as "no such image"', async () => {
    const engine = new EngineApi(fakeSocket)
    // no Server header (not Docker's): from /version
    expect(await engine.ping()).toEqual({server: '19.03.0', api: '1.40'})
    expect(await engine.inspectImage('known:1')).toMatchObject({Id: 'sha256:abc'})
    expect(await engine.inspectImage('absent:1')).toBeUndefined()
    expect((await engine.inspectImage('large:1'))?.Config?.Env).toEqual(LARGE_ENV) // an answer of many reads, whole
    expect(paths).toEqual([
      '/_ping',
      '/version',
      '/images/known:1/json',
      '/images/absent:1/json',
      '/images/large:1/json',
    ])
    // Docker's /_ping names its release: no /version (it costs the engine ≈ 7 ms)
    paths.length = 0
    serverHeader = {Server: 'Docker/19.03.1 (linux)'}
    expect(await new EngineApi(fakeSocket).ping()).toEqual({server: '19.03.1', api: '1.40'})
    expect(paths).toEqual(['/_ping'])
    // DOCKER_API_VERSION pins the version, as it does for the CLI
    paths.length = 0
    await new EngineApi(fakeSocket, {apiVersion: '1.39'}).inspectImage('known:1')
    expect(paths).toEqual(['/v1.39/images/known:1/json'])
    serverHeader = {}
  })

  it('an image reference that is not one never reaches the request path (no other endpoint, no query)', async () => {
    paths.length = 0
    for (const ref of ['../containers/x', 'x?force=1', 'x#y', 'x y', '-x']) {
      await expect(removeImage(new EngineApi(fakeSocket), ref), ref).rejects.toMatchObject({code: 'E_CONFIG'})
    }
    expect(paths).toEqual([])
  })

  it('an error the engine answers with is E_DOCKER with its message', async () => {
    await expect(new EngineApi(fakeSocket).containers(['meepagateway=1'])).rejects.toMatchObject({
      code: 'E_DOCKER',
      exitCode: 10,
      message: expect.stringContaining('the list is broken'),
    })
  })

  it('an engine that accepts and never answers gives E_DOCKER_HUNG at the deadline instead of hanging', async () => {
    const engine = new EngineApi(hungSocket)
    const started = Date.now()
    const error = await engine.ping({timeoutMs: 800}).catch((caught: unknown) => caught)
    expect(Date.now() - started).toBeLessThan(3000)
    expect(error).toMatchObject({
      code: 'E_DOCKER_HUNG',
      exitCode: 10,
      message: expect.stringContaining('did not answer'),
    })
    expect((error as {suggestions: string[]}).suggestions.join(' ')).toMatch(/restart/)
    expect(held.length).toBeGreaterThan(0) // it really reached the hung socket
  })

  it('an AbortSignal stops a call to a hung engine at once', async () => {
    const controller = new AbortController()
    const started = Date.now()
    setTimeout(() => controller.abort(), 200)
    await expect(
      new EngineApi(hungSocket).inspectImage(BASE_IMAGE, {signal: controller.signal, timeoutMs: 60_000}),
    ).rejects.toMatchObject({
      code: 'E_DOCKER',
      message: expect.stringContaining('cancelled'),
    })
    expect(Date.now() - started).toBeLessThan(3000)
  })

  it('no engine at the socket gives E_DOCKER_DOWN (exit 10), as the CLI does', async () => {
    const error = await new EngineApi(path.join(dir, 'absent.sock')).ping().catch((caught: unknown) => caught)
    expect(error).toMatchObject({
      code: 'E_DOCKER_DOWN',
      exitCode: 10,
      retryable: true,
      message: expect.stringContaining('absent.sock'),
    })
    expect((error as {suggestions: string[]}).suggestions.join(' ')).toMatch(/systemctl start docker/)
  })
})

describe('`container clean` when the engine refuses one removal', () => {
  let home: TestHome
  let server: http.Server
  const deleted: string[] = []
  // two containers left behind (their owner is gone); the engine will not remove the first
  const left = (id: string) => ({
    Id: id,
    Name: `/meepa-${id}`,
    Created: '2026-01-01T00:00:00Z',
    Image: 'sha256:img',
    State: {Status: 'exited', Running: false},
    Config: {
      Image: BASE_IMAGE,
      Labels: {meepagateway: '1', 'meepagateway.agent': 'box', 'meepagateway.pid': '999999999'},
    },
  })
  beforeAll(async () => {
    home = makeHome(
      fakeLlmConfig('http://127.0.0.1:9/v1', [{id: 'box', container_mode: {enabled: true, network: 'host'}}]),
    )
    server = http.createServer((req, res) => {
      const url = req.url ?? ''
      if (req.method === 'DELETE') {
        deleted.push(url.split('?')[0]!)
        return url.startsWith('/containers/stuck')
          ? res.writeHead(500).end(JSON.stringify({message: 'driver failed to remove root filesystem'}))
          : res.writeHead(204).end()
      }
      if (url === '/_ping')
        return res.writeHead(200, {'API-Version': '1.41', Server: 'Docker/20.10.24 (linux)'}).end('OK')
      if (url.startsWith('/containers/json'))
        return res.writeHead(200).end(JSON.stringify([{Id: 'stuck'}, {Id: 'gone'}]))
      if (url === '/containers/stuck/json' || url === '/containers/gone/json')
        return res.writeHead(200).end(JSON.stringify(left(url.split('/')[2]!)))
      if (url.startsWith('/images/json')) return res.writeHead(200).end('[]')
      res.writeHead(404).end(JSON.stringify({message: 'not here'}))
    })
    await listen(server, path.join(home.home, 'engine.sock'))
  })
  afterAll(async () => {
    server.closeAllConnections()
    await new Promise((resolve) => server.close(resolve))
    home.cleanup()
  })

  it("removes the others, keeps that one with the engine's reason, and goes on to the images (exit 0)", async () => {
    const result = await runCli(['container', 'clean', '--json'], {
      home: home.home,
      env: {DOCKER_HOST: `unix://${home.home}/engine.sock`},
    })
    expect(result.exitCode, result.stderr).toBe(0)
    const cleaned = JSON.parse(result.stdout)
    expect(cleaned.containers.map((container: {name: string}) => container.name)).toEqual(['meepa-gone'])
    expect(cleaned.kept_containers).toEqual([
      {name: 'meepa-stuck', reason: 'docker refused: driver failed to remove root filesystem'},
    ])
    expect(deleted.sort()).toEqual(['/containers/gone', '/containers/stuck'])
    const text = await runCli(['container', 'clean'], {
      home: home.home,
      env: {DOCKER_HOST: `unix://${home.home}/engine.sock`},
    })
    expect(text.stdout).toContain('kept container meepa-stuck: docker refused: driver failed to remove root filesystem')
  })
})

describe('`container status` without the engine', () => {
  let home: TestHome
  let hungServer: net.Server
  const held: net.Socket[] = []
  beforeAll(async () => {
    home = makeHome(
      fakeLlmConfig('http://127.0.0.1:9/v1', [{id: 'boxed', container_mode: {enabled: true, network: 'host'}}]),
    )
    hungServer = net.createServer((socket) => held.push(socket))
    await listen(hungServer, path.join(home.home, 'hung.sock'))
  })
  afterAll(async () => {
    for (const socket of held) socket.destroy()
    await new Promise((resolve) => hungServer.close(resolve))
    home.cleanup()
  })

  it('an engine that accepts and never answers: exit 10 with E_DOCKER_HUNG at the ping deadline (10 s), not a hang', async () => {
    const started = Date.now()
    const result = await runCli(['container', 'status', '--json'], {
      home: home.home,
      env: {DOCKER_HOST: `unix://${home.home}/hung.sock`},
      timeoutMs: 30_000,
    })
    expect(Date.now() - started).toBeLessThan(20_000)
    expect(result.exitCode).toBe(10)
    expect(JSON.parse(result.stdout).error).toMatchObject({
      code: 'E_DOCKER_HUNG',
      message: expect.stringContaining('did not answer'),
    })
    expect(held.length).toBeGreaterThan(0)
  }, 30_000)

  // the engine is asked before the config is read (container status): a bad config still wins, at once
  it('an invalid config is reported (exit 3, E_CONFIG) before a hung or missing engine, without waiting for it', async () => {
    const config = path.join(home.home, 'bad.yaml')
    fs.writeFileSync(config, 'agents: [{id: "Not An Id"}]\n')
    for (const socket of ['hung.sock', 'absent.sock']) {
      const started = Date.now()
      const result = await runCli(['container', 'status', '--json', '--config', config], {
        home: home.home,
        env: {DOCKER_HOST: `unix://${home.home}/${socket}`},
        timeoutMs: 30_000,
      })
      expect(Date.now() - started, socket).toBeLessThan(5_000)
      expect(result.exitCode, socket).toBe(3)
      expect(JSON.parse(result.stdout).error, socket).toMatchObject({code: 'E_CONFIG'})
    }
  })

  it('a missing socket exits 10 with E_DOCKER_DOWN and the fix', async () => {
    const result = await runCli(['container', 'status', '--json'], {
      home: home.home,
      env: {DOCKER_HOST: `unix://${home.home}/absent.sock`},
    })
    expect(result.exitCode).toBe(10)
    const error = JSON.parse(result.stdout).error
    expect(error).toMatchObject({
      code: 'E_DOCKER_DOWN',
      message: expect.stringContaining(`DOCKER_HOST=unix://${home.home}/absent.sock`),
    })
    expect(error.suggestions).toEqual(expect.arrayContaining([expect.stringContaining('systemctl start docker')]))
  })
})

describeWithDocker('Engine API client against the real engine', () => {
  let dir: string
  let engine: EngineApi
  const cli = new DockerCli()
  const containerName = `meepa-test-api-${unique}`

  beforeAll(async () => {
    dir = tempDir('meepa-engine-api-real-')
    engine = new EngineApi(DEFAULT_DOCKER_SOCKET)
    const created = await docker([
      'create',
      '--name',
      containerName,
      '--network',
      'none',
      '--label',
      'meepagateway=1',
      '--label',
      `meepagateway.home=${homeLabel(dir)}`,
      '--label',
      'meepagateway.agent=api',
      '--label',
      'meepagateway.pid=999999999',
      BASE_IMAGE,
      'true',
    ])
    if (created.exitCode !== 0) throw new Error(`docker create: ${created.stderr}`)
  }, 120_000)
  afterAll(async () => {
    await docker(['rm', '-f', containerName])
    fs.rmSync(dir, {recursive: true, force: true})
  }, 120_000)

  it('reports the version the CLI reports', async () => {
    const server = JSON.parse((await docker(['version', '--format', '{{json .Server}}'])).stdout) as {
      Version: string
      ApiVersion: string
    }
    expect(await engine.ping()).toEqual({server: server.Version, api: server.ApiVersion})
    expect(await cli.ping()).toEqual(await engine.ping())
  })

  it('inspects an image as `docker image inspect` does, and a missing one as undefined', async () => {
    const viaCli = JSON.parse(
      (await docker(['image', 'inspect', '--format', '{{json .}}', BASE_IMAGE])).stdout,
    ) as Record<string, unknown>
    const viaApi = await engine.inspectImage(BASE_IMAGE)
    expect(viaApi).toMatchObject({
      Id: viaCli.Id,
      RepoTags: viaCli.RepoTags,
      Architecture: viaCli.Architecture,
      Os: viaCli.Os,
      Size: viaCli.Size,
      Created: viaCli.Created,
    })
    expect(viaApi?.Config?.Env).toEqual((viaCli.Config as {Env: string[]}).Env)
    expect(await engine.inspectImage(`meepa-test-absent:${unique}`)).toBeUndefined()
  })

  it("lists a home's gateway containers exactly as the CLI path does", async () => {
    const viaApi = await listGatewayContainers(engine, {home: dir})
    expect(viaApi.map((container) => container.name)).toEqual([containerName])
    expect(viaApi[0]).toMatchObject({
      agent: 'api',
      state: 'created',
      running: false,
      ownerPid: 999_999_999,
      image: BASE_IMAGE,
    })
    expect(viaApi).toEqual(await listGatewayContainers(cli, {home: dir}))
    expect(await listGatewayContainers(engine, {home: path.join(dir, 'other')})).toEqual([])
  })

  it('lists labelled images as the CLI path does, and removes a tag as `docker image rm` does: gone, gone already, refused while a container uses it', async () => {
    const label = `meepa-test-api-images=${unique}`
    const tag = `meepa-test-api-rmi:${unique}`
    const built = await execa('docker', ['build', '--network', 'none', '-t', tag, '-'], {
      input: `FROM ${BASE_IMAGE}\nLABEL ${label}\n`,
      reject: false,
      timeout: 120_000,
    })
    expect(built.exitCode, built.stderr).toBe(0)
    const user = `meepa-test-api-rmi-user-${unique}`
    try {
      const viaApi = await labelledImages(engine, [label])
      expect(viaApi.map((image) => image.tags)).toEqual([[tag]])
      expect(viaApi).toEqual(await labelledImages(cli, [label]))

      expect((await docker(['create', '--name', user, '--network', 'none', tag, 'true'])).exitCode).toBe(0)
      // in the engine's words on both paths (the CLI's "Error response from daemon: " left out)
      const refusal = await removeImage(engine, tag)
      expect(refusal).toMatch(/^conflict: .*container .*is using/)
      expect(await removeImage(cli, tag)).toBe(refusal)
      expect((await docker(['image', 'inspect', tag])).exitCode).toBe(0)
      await docker(['rm', '-f', user])

      for (const remover of [engine, cli]) {
        const extra = `${tag}-${remover === engine ? 'api' : 'cli'}`
        expect((await docker(['tag', tag, extra])).exitCode).toBe(0)
        expect(await removeImage(remover, extra)).toBeUndefined()
        expect((await docker(['image', 'inspect', extra])).exitCode).not.toBe(0)
        expect(await removeImage(remover, extra)).toBeUndefined() // gone already: done too
      }
      expect((await docker(['image', 'inspect', tag])).exitCode).toBe(0) // only the tags were removed
    } finally {
      await docker(['rm', '-f', user])
      await docker(['image', 'rm', '--force', tag])
    }
  }, 120_000)

  it('removes a running container as `docker rm --force --volumes` does, and one already gone without an error', async () => {
    const running = `meepa-test-api-rm-${unique}`
    const started = await docker(['run', '-d', '--name', running, '--network', 'none', BASE_IMAGE, 'sleep', '60'])
    expect(started.exitCode, started.stderr).toBe(0)
    await removeContainers(engine, [running])
    expect((await docker(['container', 'inspect', running])).exitCode).not.toBe(0)
    await expect(removeContainers(engine, [running])).resolves.toBeUndefined()
  })
})

describeWithDocker('`container status` on a local engine', () => {
  let home: TestHome
  let bin: string
  let log: string
  beforeAll(() => {
    home = makeHome(
      fakeLlmConfig('http://127.0.0.1:9/v1', [
        {id: 'boxed', container_mode: {enabled: true, network: 'host', image: BASE_IMAGE}},
      ]),
    )
    // a `docker` first on PATH that logs every start, then runs the real one
    bin = path.join(home.home, 'bin')
    log = path.join(home.home, 'docker-starts.log')
    fs.mkdirSync(bin)
    fs.writeFileSync(path.join(bin, 'docker'), `#!/bin/sh\necho "$*" >> '${log}'\nexec '${realDockerPath()}' "$@"\n`, {
      mode: 0o755,
    })
  })
  afterAll(() => home.cleanup())

  it('starts no docker process and reports the engine and API versions', async () => {
    const result = await runCli(['container', 'status', '--json'], {
      home: home.home,
      env: {PATH: `${bin}:${process.env.PATH}`},
    })
    expect(result.exitCode).toBe(0)
    const status = JSON.parse(result.stdout)
    const server = JSON.parse((await docker(['version', '--format', '{{json .Server}}'])).stdout) as {
      Version: string
      ApiVersion: string
    }
    expect(status.engine).toEqual({reachable: true, server_version: server.Version, api_version: server.ApiVersion})
    expect(status.agents).toEqual([expect.objectContaining({agent: 'boxed', base: BASE_IMAGE})])
    expect(fs.existsSync(log) ? fs.readFileSync(log, 'utf8') : '').toBe('')
  })

  it('the text output names the engine and its API version', async () => {
    const result = await runCli(['container', 'status'], {home: home.home})
    expect(result.exitCode).toBe(0)
    expect(result.stdout).toMatch(/^engine: Docker \S+ \(API \d+\.\d+\)$/m)
  })
})
