import {execa} from 'execa'
import fs from 'node:fs'
import path from 'node:path'
import {afterAll, beforeAll, expect, it} from 'vitest'
import {startFakeLlm, type FakeLlm} from '../../../fakes/llm-server.js'
import {fakeLlmConfig, makeHome, type TestHome} from '../../../helpers/home.js'
import {runShellWithStandby} from '../../../helpers/standby-message.js'
import {describeWithDocker, runningStandby} from '../../../helpers/docker-env.js'
import {stopStandbyContainers} from '../../../../src/runtime/runners/container/standby-pool.js'
import {EngineApi, localEngineApi} from '../../../../src/sandbox/docker/engine-api.js'
import {PODMAN_SOCKET} from '../../../helpers/podman-engine.js'
import {
  buildCreateRequest,
  buildDockerRunArgs,
  CONTAINER_HOSTS,
  type DockerRunSpec,
} from '../../../../src/sandbox/docker/run-args.js'

/*
 * A `network: none` container on this machine's engine is created over the Engine API with
 * NetworkDisabled (no network stack of the engine's, ≈ 80 ms of CPU less per container) and
 * started with `docker start -ai`. What must hold: the same hardened container as `docker run`'s
 * argv makes, a namespace holding only `lo` where `localhost` still resolves, nothing reachable.
 */
describeWithDocker('network: none containers created with no network stack (real engine)', () => {
  let llm: FakeLlm
  let home: TestHome
  const made: string[] = []

  beforeAll(async () => {
    llm = await startFakeLlm()
    process.env.FAKE_LLM_KEY = 'sk-fake-test-key-123456'
    home = makeHome(
      fakeLlmConfig(llm.openaiBaseUrl, [
        {id: 'offline', container_mode: {enabled: true, network: 'none', memory_limit: '256m', timeout_seconds: 30}},
      ]),
    )
  })
  afterAll(async () => {
    await stopStandbyContainers()
    if (made.length > 0) await execa('docker', ['rm', '-f', ...made], {reject: false})
    await llm.close()
    home.cleanup()
  })

  const inspect = async (name: string) =>
    JSON.parse((await execa('docker', ['container', 'inspect', name])).stdout)[0] as {
      AppArmorProfile: string
      Config: Record<string, unknown>
      HostConfig: Record<string, unknown>
    }

  it("creates the container docker run's argv would, only without the engine's network", async () => {
    const image = (await execa('docker', ['image', 'inspect', '--format', '{{.Id}}', 'debian:bookworm-slim'])).stdout
    const workspace = fs.mkdtempSync(path.join(process.env.TMPDIR ?? '/tmp', 'meepa-nd-ws-'))
    const hostsFile = path.join(workspace, '..', `${path.basename(workspace)}-hosts`)
    fs.writeFileSync(hostsFile, CONTAINER_HOSTS)
    const spec: DockerRunSpec = {
      name: '',
      image,
      workspace,
      uid: 65532,
      gid: 65532,
      memoryLimit: '300m',
      pidsLimit: 77,
      fileSizeLimit: 5 * 1024 * 1024,
      cpus: 0.5,
      network: 'none',
      listen: 'deny',
      labels: {'meepagateway.test': 'network-disabled'},
      forwardEnv: ['SOME_TOKEN'],
      sandboxHelper: '/opt/helper',
    }
    const byCli = `meepa-nd-cli-${process.pid}`
    const byApi = `meepa-nd-api-${process.pid}`
    made.push(byCli, byApi)
    const argv = buildDockerRunArgs({...spec, name: byCli})
    await execa('docker', ['create', ...argv.slice(1)], {env: {SOME_TOKEN: 'value-1'}})
    await localEngineApi()!.createContainer(byApi, buildCreateRequest({...spec, hostsFile}, {SOME_TOKEN: 'value-1'}))
    const [cli, api] = [await inspect(byCli), await inspect(byApi)]
    fs.rmSync(workspace, {recursive: true, force: true})
    fs.rmSync(hostsFile, {force: true})

    const config = ['Image', 'User', 'WorkingDir', 'Entrypoint', 'Cmd', 'Labels', 'OpenStdin', 'StdinOnce']
    for (const key of config) expect([key, api.Config[key]]).toEqual([key, cli.Config[key]])
    // the same variables; the CLI puts the image's own after the run's
    expect((api.Config.Env as string[]).toSorted()).toEqual((cli.Config.Env as string[]).toSorted())
    const host = [
      'ReadonlyRootfs',
      'CapDrop',
      'CapAdd',
      'SecurityOpt',
      'Privileged',
      'Memory',
      'MemorySwap',
      'PidsLimit',
      'NanoCpus',
      'Ulimits',
      'CgroupnsMode',
      'Init',
      'Tmpfs',
      'Binds',
      'LogConfig',
      'NetworkMode',
      'IpcMode',
      'PidMode',
      'UsernsMode',
      'Devices',
      'MaskedPaths',
      'ReadonlyPaths',
      'ShmSize',
      'OomKillDisable',
      'Sysctls',
      'Runtime',
      'CgroupParent',
      'GroupAdd',
      'PublishAllPorts',
      'Dns',
    ]
    // an empty list may read as null on one side
    const value = (config: Record<string, unknown>, key: string) => config[key] ?? []
    for (const key of host) expect([key, value(api.HostConfig, key)]).toEqual([key, value(cli.HostConfig, key)])
    expect([api.AppArmorProfile, api.HostConfig.MaskedPaths]).toEqual([cli.AppArmorProfile, cli.HostConfig.MaskedPaths])
    expect((api.HostConfig.MaskedPaths as string[]).length).toBeGreaterThan(0)
    expect(api.Config.Env).toContain('SOME_TOKEN=value-1')
    expect(cli.HostConfig.Memory).toBe(300 * 1024 * 1024)
    expect(api.Config.NetworkDisabled).toBe(true)
    expect(cli.Config.NetworkDisabled).toBeFalsy()
    expect(api.HostConfig.Mounts).toEqual([{Type: 'bind', Source: hostsFile, Target: '/etc/hosts', ReadOnly: true}])
  }, 60_000)

  it('runs a message in a namespace holding only lo: localhost resolves, the LLM and the engine are out of reach, /etc/hosts cannot be changed', async () => {
    const probe = [
      "tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' ' | tr '\\n' ' '",
      'echo; getent hosts localhost | head -1',
      `node -e 'const s=require("net").connect(${llm.port},"127.0.0.1");s.on("connect",()=>{console.log("CONNECTED");process.exit(0)});s.on("error",e=>{console.log("llm",e.code)})'`,
      `node -e 'require("net").createServer().listen(0,"localhost",function(){const p=this.address().port;require("net").connect(p,"localhost",()=>{console.log("loopback ok");process.exit(0)})}).on("error",e=>console.log("loopback",e.code))'`,
      '{ echo 10.0.0.1 evil >> /etc/hosts; } 2>&1 | head -1',
      'test -e /var/run/docker.sock && echo SOCKET; echo done',
    ].join('; ')
    const result = await runShellWithStandby(llm, home, 'offline', probe)
    if (!result.output.ok) throw new Error(JSON.stringify(result.output.error))
    const said = result.output.reply.content
    expect(said).toMatch(/^lo \n/m)
    expect(said).toMatch(/^(127\.0\.0\.1|::1)\s+localhost/m)
    expect(said).toMatch(/llm E(CONNREFUSED|NETUNREACH)/)
    expect(said).not.toContain('CONNECTED')
    // allow_listen is off: the helper's layer refuses the listen itself
    expect(said).toMatch(/loopback (ok|EACCES|EPERM)/)
    expect(said).toMatch(/\/etc\/hosts: (Permission denied|Read-only file system)/)
    expect(said).not.toContain('SOCKET')
    expect(said).toContain('done')
    expect(fs.readFileSync(path.join(home.home, 'cache', 'container-hosts'), 'utf8')).toBe(CONTAINER_HOSTS)

    // the standby the run left is made the same way
    const standby = await runningStandby(home.home)
    expect((await inspect(standby)).Config.NetworkDisabled).toBe(true)
  }, 120_000)

  it('the engine API path is only taken where Docker itself answers: Podman on a Docker socket is told apart', async () => {
    expect(await localEngineApi()!.isDocker()).toBe(true)
    if (fs.existsSync(PODMAN_SOCKET)) expect(await new EngineApi(PODMAN_SOCKET).isDocker()).toBe(false)
  })

  it('a hosts file tampered with in the home is put back before the next container binds it', async () => {
    await stopStandbyContainers()
    const file = path.join(home.home, 'cache', 'container-hosts')
    fs.rmSync(file)
    fs.symlinkSync('/etc/shadow', file)
    const shadowMode = fs.statSync('/etc/shadow').mode
    const result = await runShellWithStandby(llm, home, 'offline', 'cat /etc/hosts')
    if (!result.output.ok) throw new Error(JSON.stringify(result.output.error))
    expect(result.output.reply.content).toContain(CONTAINER_HOSTS.trim())
    expect(result.output.reply.content).not.toContain('root:')
    expect(fs.lstatSync(file).isFile()).toBe(true)
    expect(fs.statSync(file).mode & 0o777).toBe(0o644)
    // the link's target was never written nor made readable
    expect(fs.statSync('/etc/shadow').mode).toBe(shadowMode)
    // a file narrowed to its owner is made readable by the container's user again
    await stopStandbyContainers()
    fs.chmodSync(file, 0o600)
    const again = await runShellWithStandby(llm, home, 'offline', 'cat /etc/hosts')
    if (!again.output.ok) throw new Error(JSON.stringify(again.output.error))
    expect(again.output.reply.content).toContain(CONTAINER_HOSTS.trim())
  }, 120_000)
})
