import {execa} from 'execa'
import fs from 'node:fs'
import path from 'node:path'
import {afterAll, beforeAll, expect, it} from 'vitest'
import {startFakeLlm, type FakeLlm} from '../../fakes/llm-server.js'
import {BIN, fakeLlmConfig, makeHome, runCli, type TestHome} from '../../helpers/home.js'
import {DEFAULT_AGENT, DEFAULT_IMAGE_CONFIG} from '../../../src/runtime/config/defaults.js'
import type {GatewayConfig} from '../../../src/runtime/config/types.js'
import {containerImageContext} from '../../../src/runtime/container/context.js'
import {removeOrphanContainers} from '../../../src/runtime/container/clean.js'
import {DockerCli} from '../../../src/sandbox/docker/cli.js'
import {homeLabel} from '../../../src/sandbox/docker/home-label.js'
import {computeAppHash} from '../../../src/sandbox/docker/app-bundle.js'
import {
  detectPackageManager,
  ensureIsolationImage,
  inspectImages,
  planImages,
  type ImageContext,
} from '../../../src/sandbox/docker/images.js'
import {BASE_IMAGE, describeWithDocker, dockerRecorder, tempDir, type DockerRecorder} from '../../helpers/docker-env.js'

/*
 * The image pipeline and the `container` commands against the real engine. One file on purpose:
 * `container clean` removes images engine-wide, so it must not run beside the image tests.
 */

const unique = `${process.pid}-${Date.now().toString(36)}`
const docker = (args: string[], input?: string) => execa('docker', args, {input, reject: false, timeout: 300_000})

/** A throwaway image built from a Dockerfile on stdin (no context). */
async function buildImage(tag: string, dockerfile: string): Promise<void> {
  const result = await docker(['build', '--network', 'none', '-t', tag, '-'], dockerfile)
  if (result.exitCode !== 0) throw new Error(`docker build ${tag}: ${result.stderr}`)
}

/** Re-tags an image with an edited config (architecture, creation date): docker save, edit, docker load. */
async function loadEdited(source: string, tag: string, edit: (config: Record<string, unknown>) => void): Promise<void> {
  const dir = tempDir('meepa-image-edit-')
  try {
    await execa('sh', ['-c', `docker save '${source}' | tar -x -C '${dir}'`])
    const manifest = JSON.parse(fs.readFileSync(path.join(dir, 'manifest.json'), 'utf8')) as Array<{
      Config: string
      RepoTags: string[]
    }>
    const configFile = path.join(dir, manifest[0]!.Config)
    const config = JSON.parse(fs.readFileSync(configFile, 'utf8')) as Record<string, unknown>
    edit(config)
    fs.writeFileSync(configFile, JSON.stringify(config))
    manifest[0]!.RepoTags = [tag]
    fs.writeFileSync(path.join(dir, 'manifest.json'), JSON.stringify(manifest))
    await execa('sh', ['-c', `tar -C '${dir}' -c . | docker load`])
  } finally {
    fs.rmSync(dir, {recursive: true, force: true})
  }
}

function gatewayConfig(imageConfig: Partial<GatewayConfig['image_config']> = {}): GatewayConfig {
  return {image_config: {...DEFAULT_IMAGE_CONFIG, ...imageConfig}} as GatewayConfig
}
const agent = (image = '') => ({
  ...DEFAULT_AGENT,
  id: 'a',
  name: 'a',
  container_mode: {...DEFAULT_AGENT.container_mode, enabled: true, image},
})

describeWithDocker('container images (real engine)', () => {
  const throwaway: string[] = []
  let recorder: DockerRecorder
  let context: ImageContext
  let cacheDir: string
  const builds = () => recorder.calls().filter((call) => call[0] === 'build')

  beforeAll(() => {
    const dir = tempDir('meepa-images-')
    cacheDir = path.join(dir, 'cache')
    recorder = dockerRecorder(dir)
    context = {...containerImageContext(dir, {cli: new DockerCli({bin: recorder.bin})}), cacheDir}
  })
  afterAll(async () => {
    if (throwaway.length > 0) await docker(['image', 'rm', '--force', ...throwaway])
  }, 600_000)

  it('builds the isolation image on first use, never rebuilds it while up to date, and rebuilds it when its runtime or base changes', async () => {
    const base = `meepa-test-base:${unique}`
    await buildImage(base, `FROM ${BASE_IMAGE}\nLABEL meepa.test=one\n`)
    throwaway.push(base)
    const plan = await planImages(gatewayConfig(), agent(base), context)
    throwaway.push(plan.isolationTag)
    expect(plan.isolationTag).toBe(`meepagateway-isolated:0.1.0-meepa-test-base-${unique}`)

    // The app hash is pinned: in a shared tree another build may change dist/ while this test runs.
    const appHash = await computeAppHash(context.app)
    const progress: string[] = []
    const first = await ensureIsolationImage(plan, {...context, onLog: (line) => progress.push(line)}, {appHash})
    expect(first).toMatchObject({built: true, reason: 'missing'})
    expect(progress.join('\n')).toContain('Successfully tagged')

    recorder.clear()
    const started = Date.now()
    expect(await ensureIsolationImage(plan, context, {appHash})).toMatchObject({built: false, reason: 'up to date'})
    expect(Date.now() - started).toBeLessThan(1000)
    expect(builds()).toEqual([])
    // base and isolation image in one docker process (each docker start costs tens of ms)
    expect(recorder.calls().filter((call) => call[0] === 'image' && call[1] === 'inspect')).toEqual([
      ['image', 'inspect', '--format', '{{json .}}', base, plan.isolationTag],
    ])

    expect(await ensureIsolationImage(plan, context, {appHash: 'changed-dist'})).toMatchObject({
      built: true,
      reason: 'meepagateway runtime changed',
    })

    await buildImage(base, `FROM ${BASE_IMAGE}\nLABEL meepa.test=two\n`)
    expect(await ensureIsolationImage(plan, context, {appHash: 'changed-dist'})).toMatchObject({
      built: true,
      reason: 'base image changed',
    })
    const labels = JSON.parse(
      (await docker(['image', 'inspect', '--format', '{{json .Config.Labels}}', plan.isolationTag])).stdout,
    )
    const baseId = (await docker(['image', 'inspect', '--format', '{{.Id}}', base])).stdout.trim()
    expect(labels['meepagateway.base-id']).toBe(baseId)
  }, 600_000)

  it('inspects several images in one call and still tells which one is missing', async () => {
    const missing = `meepa-test-missing:${unique}`
    const [found, absent] = await inspectImages(context.cli, [BASE_IMAGE, missing])
    expect(found?.tags).toContain(BASE_IMAGE)
    expect(absent).toBeUndefined()
    const [absentFirst, foundSecond] = await inspectImages(context.cli, [missing, BASE_IMAGE])
    expect(absentFirst).toBeUndefined()
    expect(foundSecond?.id).toBe(found?.id)
  }, 60_000)

  it('reports a base without glibc (Alpine-like) before building anything, with the fix', async () => {
    const base = `meepa-test-nolibc:${unique}`
    const dir = tempDir('meepa-nolibc-')
    fs.mkdirSync(path.join(dir, 'etc'))
    fs.writeFileSync(path.join(dir, 'etc', 'os-release'), 'ID=alpine\n')
    await execa('sh', ['-c', `tar -C '${dir}' -c . | docker import - '${base}'`])
    throwaway.push(base)
    recorder.clear()
    const error = await ensureIsolationImage(await planImages(gatewayConfig(), agent(base), context), context).catch(
      (caught: unknown) => caught,
    )
    expect(error).toMatchObject({code: 'E_IMAGE', message: expect.stringMatching(/has no \/lib.*ld-linux.*C library/)})
    expect((error as {suggestions: string[]}).suggestions.join(' ')).toContain('debian:bookworm-slim')
    expect(builds()).toEqual([])
  }, 600_000)

  it('reports a base of another architecture before building anything ("exec format error"), with the fix', async () => {
    const base = `meepa-test-arm:${unique}`
    const foreign = process.arch === 'arm64' ? 'amd64' : 'arm64'
    await loadEdited(BASE_IMAGE, base, (config) => (config.architecture = foreign))
    throwaway.push(base)
    recorder.clear()
    const error = await ensureIsolationImage(await planImages(gatewayConfig(), agent(base), context), context).catch(
      (caught: unknown) => caught,
    )
    expect(error).toMatchObject({code: 'E_IMAGE', message: expect.stringContaining(`linux/${foreign}`)})
    expect((error as {message: string}).message).toContain('exec format error')
    expect((error as {suggestions: string[]}).suggestions.join(' ')).toContain('--platform')
    expect(builds()).toEqual([])
  }, 600_000)

  it('never pulls: a base that is not on the machine is an E_IMAGE naming `docker pull`', async () => {
    recorder.clear()
    const plan = await planImages(gatewayConfig(), agent(`meepa-test-absent:${unique}`), context)
    const error = await ensureIsolationImage(plan, context).catch((caught: unknown) => caught)
    expect(error).toMatchObject({
      code: 'E_IMAGE',
      suggestions: [expect.stringContaining('docker pull'), expect.any(String)],
    })
    expect(recorder.calls().filter((call) => call.includes('pull') && call[0] === 'pull')).toEqual([])
  }, 600_000)

  it('detects apt on a Debian base once and remembers it by image ID', async () => {
    recorder.clear()
    expect(await detectPackageManager(BASE_IMAGE, context)).toBe('apt')
    expect(await detectPackageManager(BASE_IMAGE, {...context, cli: new DockerCli({bin: recorder.bin})})).toBe('apt')
    expect(recorder.calls().filter((call) => call[0] === 'run')).toHaveLength(1)
    const baseId = (await docker(['image', 'inspect', '--format', '{{.Id}}', BASE_IMAGE])).stdout.trim()
    expect(JSON.parse(fs.readFileSync(path.join(cacheDir, 'docker-base-images.json'), 'utf8'))[baseId]).toEqual({
      package_manager: 'apt',
    })
  }, 600_000)
})

describeWithDocker('container commands (real engine)', () => {
  let llm: FakeLlm
  let home: TestHome
  let recorder: DockerRecorder
  const cli = (...args: string[]) =>
    runCli(['container', ...args], {home: home.home, env: {MEEPAGATEWAY_DOCKER_BIN: recorder.bin}, timeoutMs: 600_000})
  // as an operator runs it: no injected binary, so a local engine is asked over its API; a docker
  // it starts is still recorded
  const onLocalEngine = (...args: string[]) =>
    runCli(['container', ...args], {
      home: home.home,
      env: {PATH: `${path.dirname(recorder.bin)}/path:${process.env.PATH}`},
      timeoutMs: 600_000,
    })
  // 'plain' refers to the isolation image of the bare base, which the send tests use meanwhile:
  // `container clean` below must keep it.
  const config = (packages: string[]) =>
    fakeLlmConfig(
      llm.openaiBaseUrl,
      [
        {id: 'box', container_mode: {enabled: true, network: 'host'}},
        {id: 'plain', container_mode: {enabled: true, network: 'host', image: BASE_IMAGE}},
      ],
      {image_config: {enabled: true, packages}},
    )

  beforeAll(async () => {
    llm = await startFakeLlm()
    home = makeHome()
    home.writeConfig(config([]))
    recorder = dockerRecorder(home.home)
    fs.mkdirSync(path.join(home.home, 'path'))
    fs.symlinkSync(recorder.bin, path.join(home.home, 'path', 'docker'))
  })
  afterAll(async () => {
    await llm.close()
    home.cleanup()
  }, 600_000)

  it('`container build` twice: the second finds everything up to date and runs no docker build', async () => {
    const app = containerImageContext(home.home).app
    let second: Awaited<ReturnType<typeof cli>>
    let elapsed: number
    // In a shared working tree another build may rewrite dist/ between the two runs (a real
    // runtime change); then the pair is repeated. In CI dist/ is built once, before all tests.
    for (let attempt = 0; ; attempt++) {
      const first = await cli('build')
      expect(first.exitCode).toBe(0)
      expect(first.stdout).toContain('agent box: build isolation image')
      const hash = await computeAppHash(app)
      recorder.clear()
      const started = Date.now()
      second = await cli('build', '--json')
      elapsed = Date.now() - started
      if (attempt === 2 || (await computeAppHash(app)) === hash) break
    }
    expect(second.exitCode).toBe(0)
    const result = JSON.parse(second.stdout)
    expect(result.built).toBe(0)
    expect(result.images[0]).toMatchObject({
      agents: ['box'],
      container_image: {built: false, reason: 'up to date'},
      isolation_image: {built: false, reason: 'up to date'},
    })
    expect(result.images[1]).toMatchObject({agents: ['plain'], isolation_image: {built: false, reason: 'up to date'}})
    expect(recorder.calls().filter((call) => call[0] === 'build' || call[0] === 'run')).toEqual([])
    // The CLI process includes oclif start-up (without the release manifest in a dev tree it loads every command).
    process.stderr.write(`[container build] second (no-op) build took ${elapsed} ms\n`)
  }, 600_000)

  it('`container status` reports the engine, each agent image as up to date, and no running container', async () => {
    const result = await cli('status', '--json')
    expect(result.exitCode).toBe(0)
    const status = JSON.parse(result.stdout)
    expect(status.engine).toMatchObject({reachable: true, server_version: expect.any(String)})
    expect(status.agents).toEqual([
      expect.objectContaining({
        agent: 'box',
        isolation_image: expect.objectContaining({present: true, up_to_date: true}),
      }),
      expect.objectContaining({
        agent: 'plain',
        base: BASE_IMAGE,
        isolation_image: expect.objectContaining({present: true, up_to_date: true}),
      }),
    ])
    expect(status.containers).toEqual([])
  }, 600_000)

  it('`container status` exits 10 with the fix when the engine is down', async () => {
    const result = await runCli(['container', 'status', '--json'], {
      home: home.home,
      env: {DOCKER_HOST: `unix://${home.home}/none.sock`},
    })
    expect(result.exitCode).toBe(10)
    expect(JSON.parse(result.stdout).error).toMatchObject({
      code: 'E_DOCKER_DOWN',
      suggestions: expect.arrayContaining([expect.stringContaining('start')]),
    })
  }, 600_000)

  it('`container images` lists the images with size, age and the agent using them', async () => {
    const boxImage = JSON.parse((await cli('status', '--json')).stdout).agents[0].isolation_image.tag as string
    const result = await cli('images', '--json')
    expect(result.exitCode).toBe(0)
    const images = JSON.parse(result.stdout) as Array<{
      repository: string
      tag: string
      size_bytes: number
      age_seconds: number
      used_by: string[]
      in_use: boolean
    }>
    const isolation = images.find((image) => `${image.repository}:${image.tag}` === boxImage)
    expect(isolation).toMatchObject({used_by: ['box'], in_use: true})
    expect(isolation!.size_bytes).toBeGreaterThan(50_000_000)
    expect(isolation!.age_seconds).toBeGreaterThanOrEqual(0)
  }, 600_000)

  it('a changed package list gives a new tag, and the package is usable in the next run', async () => {
    const before = JSON.parse((await cli('status', '--json')).stdout).agents[0]
    llm.reset()
    llm.enqueue({toolCalls: [{name: 'shell', arguments: {command: 'jq --version'}}]}, (request) => ({
      text: String(request.body.messages.at(-1).content),
    }))
    const without = await runCli(['send', '--agent', 'box', 'jq?'], {home: home.home})
    expect(without.stdout).toMatch(/jq: not found|exit code: 127/)

    home.writeConfig(config(['jq']))
    const build = await cli('build', '--json')
    expect(build.exitCode).toBe(0)
    const after = JSON.parse(build.stdout).images[0]
    expect(after.container_image.tag).toMatch(/^meepa-sandbox:[0-9a-f]{16}$/)
    expect(after.container_image.tag).not.toBe(before.container_image.tag)
    expect(after.isolation_image.tag).not.toBe(before.isolation_image.tag)
    expect(after.dockerfile).toContain('apt-get install -y --no-install-recommends jq')

    llm.enqueue(
      {toolCalls: [{name: 'shell', arguments: {command: 'echo \'{"a": 41}\' | jq ".a + 1"'}}]},
      (request) => ({text: String(request.body.messages.at(-1).content)}),
    )
    const withJq = await runCli(['send', '--agent', 'box', 'jq!'], {home: home.home})
    expect(withJq.exitCode).toBe(0)
    expect(withJq.stdout).toContain('exit code: 0\n42')
  }, 600_000)

  it('removes containers left behind at start-up and by `container clean`, never a live run', async () => {
    const labels = (pid: number) => [
      '--label',
      'meepagateway=1',
      '--label',
      'meepagateway.agent=box',
      '--label',
      `meepagateway.home=${homeLabel(home.home)}`,
      '--label',
      `meepagateway.pid=${pid}`,
    ]
    const run = (name: string, pid: number) =>
      docker(['run', '-d', '--name', name, '--network', 'none', ...labels(pid), BASE_IMAGE, 'sleep', '300'])
    const deadOwner = `meepa-test-orphan-${unique}`
    const liveOwner = `meepa-test-live-${unique}`
    const exited = `meepa-test-exited-${unique}`
    const starting = `meepa-test-starting-${unique}`
    await run(deadOwner, 999_999_999)
    await run(liveOwner, process.pid)
    await docker(['run', '--name', exited, ...labels(process.pid), BASE_IMAGE, 'true'])
    // created a moment ago by a live runner, which is about to start it
    await docker(['create', '--name', starting, ...labels(process.pid), BASE_IMAGE, 'true'])
    try {
      const removed = await removeOrphanContainers({home: home.home})
      expect(removed.map((container) => container.name).sort()).toEqual([exited, deadOwner].sort())
      expect((await docker(['inspect', '--format', '{{.State.Running}}', liveOwner])).stdout.trim()).toBe('true')
      expect((await docker(['inspect', starting])).exitCode).toBe(0)

      await docker(['stop', '--time', '0', liveOwner])
      const dry = await cli('clean', '--dry-run', '--json')
      expect(JSON.parse(dry.stdout).containers.map((container: {name: string}) => container.name)).toContain(liveOwner)
      expect((await docker(['inspect', liveOwner])).exitCode).toBe(0)
      const clean = await cli('clean', '--json')
      expect(clean.exitCode).toBe(0)
      expect(JSON.parse(clean.stdout).containers.map((container: {name: string}) => container.name)).toContain(
        liveOwner,
      )
      expect((await docker(['inspect', liveOwner])).exitCode).not.toBe(0)
    } finally {
      await docker(['rm', '-f', deadOwner, liveOwner, exited, starting])
    }
  }, 600_000)

  it('`serve` removes containers a crashed gateway of its home left behind, at start-up', async () => {
    const orphan = `meepa-test-serve-orphan-${unique}`
    await docker([
      'run',
      '-d',
      '--name',
      orphan,
      '--network',
      'none',
      '--label',
      'meepagateway=1',
      '--label',
      'meepagateway.agent=box',
      '--label',
      `meepagateway.home=${homeLabel(home.home)}`,
      '--label',
      'meepagateway.pid=999999999',
      BASE_IMAGE,
      'sleep',
      '300',
    ])
    const serveHome = path.join(home.home, 'serve-config.yaml')
    fs.writeFileSync(
      serveHome,
      fs.readFileSync(home.configPath, 'utf8') + '\ncaptain: {enabled: false, bind: 127.0.0.1, port: 0}\n',
    )
    const serve = execa(process.execPath, [BIN, 'serve', '--unrestricted', '--config', serveHome], {
      env: {MEEPAGATEWAY_HOME: home.home},
      reject: false,
      all: true,
    })
    try {
      let output = ''
      serve.all?.on('data', (chunk) => (output += String(chunk)))
      const deadline = Date.now() + 60_000
      while (!output.includes('removed 1 container(s) left behind') && Date.now() < deadline && serve.exitCode === null)
        await new Promise((r) => setTimeout(r, 100))
      expect(output).toContain('gateway: removed 1 container(s) left behind by a previous gateway')
      expect((await docker(['inspect', orphan])).exitCode).not.toBe(0)
    } finally {
      serve.kill('SIGTERM')
      expect((await serve).exitCode).toBe(0)
      await docker(['rm', '-f', orphan])
    }
  }, 120_000)

  it('`container clean` removes leftovers and old unreferenced images, keeps what the config uses, and is idempotent', async () => {
    // a rebuilt tag leaves the old image dangling; an image older than the grace period that no config uses
    const leftover = `meepa-sandbox:test-leftover-${unique}`
    await buildImage(leftover, `FROM ${BASE_IMAGE}\nLABEL meepagateway=1 meepagateway.kind=container test=1\n`)
    const danglingId = (await docker(['image', 'inspect', '--format', '{{.Id}}', leftover])).stdout.trim()
    await buildImage(leftover, `FROM ${BASE_IMAGE}\nLABEL meepagateway=1 meepagateway.kind=container test=2\n`)
    const old = `meepa-sandbox:test-old-${unique}`
    await loadEdited(leftover, old, (config) => (config.created = '2020-01-01T00:00:00Z'))
    try {
      const dry = JSON.parse((await cli('clean', '--dry-run', '--json')).stdout)
      expect((await docker(['image', 'inspect', danglingId])).exitCode).toBe(0)
      expect(dry.images.map((image: {ref: string}) => image.ref)).toEqual(expect.arrayContaining([danglingId, old]))
      // over the Engine API: the same answer, and the same images listed, without one docker process
      const listed = (result: Awaited<ReturnType<typeof cli>>) =>
        (JSON.parse(result.stdout) as Array<Record<string, unknown>>).map(({age_seconds: _, ...image}) => image)
      const imagesViaCli = listed(await cli('images', '--json'))
      recorder.clear()
      expect(JSON.parse((await onLocalEngine('clean', '--dry-run', '--json')).stdout)).toEqual(dry)
      expect(listed(await onLocalEngine('images', '--json'))).toEqual(imagesViaCli)
      expect(recorder.calls()).toEqual([])

      const clean = await onLocalEngine('clean', '--json')
      expect(recorder.calls()).toEqual([])
      expect(clean.exitCode).toBe(0)
      const result = JSON.parse(clean.stdout)
      expect(result.images.map((image: {ref: string}) => image.ref)).toEqual(expect.arrayContaining([danglingId, old]))
      expect(result.kept).toEqual(
        expect.arrayContaining([
          expect.objectContaining({ref: leftover, reason: expect.stringContaining('minutes ago')}),
          expect.objectContaining({reason: 'used by agent box'}),
        ]),
      )
      expect((await docker(['image', 'inspect', old])).exitCode).not.toBe(0)

      const again = await cli('clean', '--json')
      expect(again.exitCode).toBe(0)
      expect(JSON.parse(again.stdout).images.map((image: {ref: string}) => image.ref)).not.toContain(old)
    } finally {
      await docker(['image', 'rm', '--force', leftover, old])
    }
  }, 600_000)
})
