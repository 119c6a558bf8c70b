import {describe, expect, it} from 'vitest'
import {DEFAULT_IMAGE_CONFIG} from '../../../src/runtime/config/defaults.js'
import {
  UNPRIVILEGED_CONTAINER_UID,
  containerUser,
  injectedSecretNames,
} from '../../../src/runtime/runners/container/runner.js'
import {buildDockerRunArgs, containerNameFor, type DockerRunSpec} from '../../../src/sandbox/docker/run-args.js'
import {isOrphan, type GatewayContainer} from '../../../src/sandbox/docker/containers.js'

const spec: DockerRunSpec = {
  name: 'meepa-run_1',
  image: 'meepagateway-isolated:0.1.0-debian-bookworm-slim',
  workspace: '/home/op/.meepagateway/agents/box',
  uid: 1000,
  gid: 1001,
  memoryLimit: '512m',
  pidsLimit: 256,
  cpus: 1,
  network: 'bridge',
  listen: 'deny',
  labels: {meepagateway: '1', 'meepagateway.agent': 'box', 'meepagateway.run': 'run_1'},
  forwardEnv: ['GITHUB_TOKEN'],
}

/** The value of a flag that takes one argument (`--memory 512m`). */
const flag = (args: string[], name: string) => args[args.indexOf(name) + 1]

describe('docker run argv (docs/isolation.md)', () => {
  const args = buildDockerRunArgs(spec)

  it('hardens the container: read-only root, no capabilities, no new privileges, init, limits', () => {
    expect(args).toEqual(
      expect.arrayContaining(['--read-only', '--cap-drop=ALL', '--security-opt=no-new-privileges', '--init', '-i']),
    )
    expect(flag(args, '--memory')).toBe('512m')
    expect(flag(args, '--memory-swap')).toBe('512m')
    expect(flag(args, '--pids-limit')).toBe('256')
    expect(flag(args, '--cpus')).toBe('1')
    expect(flag(buildDockerRunArgs({...spec, cpus: 0.5}), '--cpus')).toBe('0.5')
    expect(() => buildDockerRunArgs({...spec, cpus: 0})).toThrow(/cpus/)
    expect(flag(args, '--cgroupns')).toBe('private')
    expect(args).not.toContain('--rm') // the host inspects OOMKilled and the exit code first
    expect(args).not.toContain('--privileged')
  })

  it('runs as the host user with the workspace at /workspace as HOME and a private /tmp of 256 MB', () => {
    expect(flag(args, '--user')).toBe('1000:1001')
    expect(flag(args, '-v')).toBe('/home/op/.meepagateway/agents/box:/workspace')
    expect(flag(args, '-w')).toBe('/workspace')
    expect(args).toEqual(expect.arrayContaining(['HOME=/workspace', 'TMPDIR=/tmp']))
    expect(flag(args, '--tmpfs')).toMatch(/^\/tmp:rw,.*size=256m,uid=1000,gid=1001/)
  })

  it('never picks uid 0 for a root gateway unless container_mode.user says so', () => {
    expect(containerUser(undefined, {uid: 0, gid: 0})).toEqual({
      uid: UNPRIVILEGED_CONTAINER_UID,
      gid: UNPRIVILEGED_CONTAINER_UID,
    })
    expect(containerUser(undefined, {uid: 1000, gid: 1001})).toEqual({uid: 1000, gid: 1001})
    expect(containerUser('0', {uid: 0, gid: 0})).toEqual({uid: 0, gid: 0})
    expect(containerUser('1234:55', {uid: 0, gid: 0})).toEqual({uid: 1234, gid: 55})
  })

  it('uses the configured network, bridge included', () => {
    expect(flag(args, '--network')).toBe('bridge')
    expect(flag(buildDockerRunArgs({...spec, network: 'none'}), '--network')).toBe('none')
  })

  it('labels the gateway, the agent and the run, and names the container after the run', () => {
    expect(args).toEqual(expect.arrayContaining(['meepagateway=1', 'meepagateway.agent=box', 'meepagateway.run=run_1']))
    expect(flag(args, '--name')).toBe('meepa-run_1')
    expect(containerNameFor('run_abc/../x y')).toBe('meepa-run_abc-..-x-y')
  })

  it('forwards secrets by name only: no value ever appears in argv', () => {
    expect(args.slice(args.indexOf('GITHUB_TOKEN') - 1, args.indexOf('GITHUB_TOKEN') + 1)).toEqual([
      '-e',
      'GITHUB_TOKEN',
    ])
    expect(args.some((arg) => arg.startsWith('GITHUB_TOKEN='))).toBe(false)
  })

  it('runs agent-run of the bundled app, never pulling an image', () => {
    expect(flag(args, '--pull')).toBe('never')
    expect(flag(args, '--entrypoint')).toBe('/opt/meepagateway/bin/node')
    expect(args.slice(-3)).toEqual([spec.image, '/opt/meepagateway/app/bin/run.js', 'agent-run'])
  })

  it('refuses a memory limit, pids limit or workspace docker would misread', () => {
    expect(() => buildDockerRunArgs({...spec, memoryLimit: '512MB'})).toThrow(/memory_limit/)
    expect(() => buildDockerRunArgs({...spec, pidsLimit: 0})).toThrow(/pids_limit/)
    expect(() => buildDockerRunArgs({...spec, workspace: '/a:b/ws'})).toThrow(
      expect.objectContaining({code: 'E_WORKSPACE'}),
    )
  })
})

describe('which secrets are also set in the container environment', () => {
  const config = (credentials: boolean, secrets: boolean) =>
    ({
      providers: {
        primary: 'p',
        fallback: [],
        providers: {p: {kind: 'openai' as const, model: 'm', api_key_env: 'OPENAI_API_KEY'}},
      },
      image_config: {...DEFAULT_IMAGE_CONFIG, inject_credentials_env: credentials, inject_secrets_env: secrets},
    }) as never
  const secrets = {OPENAI_API_KEY: 'sk-1234567', GITHUB_TOKEN: 'ghp-1234567', DOCKER_HOST: 'tcp://evil:2375'}

  it('provider keys with inject_credentials_env, other secrets with inject_secrets_env', () => {
    expect(injectedSecretNames(config(true, true), secrets)).toEqual(['GITHUB_TOKEN', 'OPENAI_API_KEY'])
    expect(injectedSecretNames(config(true, false), secrets)).toEqual(['OPENAI_API_KEY'])
    expect(injectedSecretNames(config(false, true), secrets)).toEqual(['GITHUB_TOKEN'])
    expect(injectedSecretNames(config(false, false), secrets)).toEqual([])
  })

  it('never forwards a name the docker CLI itself reads', () => {
    expect(injectedSecretNames(config(true, true), secrets)).not.toContain('DOCKER_HOST')
  })
})

describe('orphan containers', () => {
  const container = (over: Partial<GatewayContainer>): GatewayContainer => ({
    id: 'c',
    name: 'n',
    image: 'i',
    imageId: 'sha256:1',
    state: 'running',
    running: true,
    created: '',
    ...over,
  })

  it('a stopped container, or one whose runner process is gone, is an orphan', () => {
    expect(isOrphan(container({running: false, state: 'exited'}), () => true)).toBe(true)
    expect(isOrphan(container({ownerPid: 4242}), () => false)).toBe(true)
  })

  it('a running container of a live runner is not, nor a running probe without an owner', () => {
    expect(isOrphan(container({ownerPid: 4242}), () => true)).toBe(false)
    expect(isOrphan(container({}), () => false)).toBe(false)
  })

  it('a container still being started (created) by a live runner is not; by a dead one, or for a minute, it is', () => {
    const now = Date.parse('2026-12-06T09:00:00Z')
    const created = {running: false, state: 'created', ownerPid: 4242, created: '2026-12-06T08:59:50Z'}
    expect(isOrphan(container(created), () => true, now)).toBe(false)
    expect(isOrphan(container(created), () => false, now)).toBe(true)
    expect(isOrphan(container({...created, ownerPid: undefined}), () => true, now)).toBe(true)
    expect(isOrphan(container({...created, created: '2026-12-06T08:58:59Z'}), () => true, now)).toBe(true)
  })
})

describe('docker run argv for Podman (its Docker-compatible API)', () => {
  const podman = buildDockerRunArgs({...spec, engineKind: 'podman', fileSizeLimit: 8 * 1024 * 1024})

  it('sets the file size limit in a shell before agent-run (the API drops --ulimit) and owns /tmp with U', () => {
    const entry = podman.indexOf('--entrypoint')
    expect(podman.slice(entry + 1, entry + 2)).toEqual(['/bin/sh'])
    expect(podman.slice(entry + 3, entry + 6)).toEqual(['-c', 'ulimit -f 16384 && exec "$@"', 'sh'])
    expect(podman.slice(entry + 6)).toEqual([
      '/opt/meepagateway/bin/node',
      '/opt/meepagateway/app/bin/run.js',
      'agent-run',
    ])
    expect(flag(podman, '--tmpfs')).toMatch(/,U,mode=0700$/)
    expect(flag(podman, '--tmpfs')).not.toMatch(/uid=/)
  })

  it('leaves out only the limits a best_effort engine cannot apply', () => {
    const without = buildDockerRunArgs({...spec, engineKind: 'podman', unappliedLimits: ['cpus', 'pids']})
    expect(without).not.toContain('--cpus')
    expect(without).not.toContain('--pids-limit')
    expect(flag(without, '--memory')).toBe('512m')
    expect(buildDockerRunArgs(spec)).toContain('--cpus')
  })
})
