import type {ContainerNetwork} from '../../runtime/config/types.js'
import {GatewayError} from '../../runtime/util/errors.js'
import {CONTAINER_APP, CONTAINER_NODE} from './dockerfile.js'
import {SANDBOX_HELPER_ENV, SANDBOX_LISTEN_ENV} from '../../runtime/shapes/tool-shell.js'
import {IN_CONTAINER_ENV} from '../../runtime/agent-run/in-container.js'

/** Everything that decides the `docker run` of one message (docs/isolation.md, container mode). */
export interface DockerRunSpec {
  name: string
  image: string
  /** Host path of the agent's workspace (canonical, existing). */
  workspace: string
  uid: number
  gid: number
  /** Docker size, e.g. 512m; used for --memory and --memory-swap (no swap beyond the limit). */
  memoryLimit: string
  pidsLimit: number
  /**
   * limits.disk in bytes: no file the run writes grows past it (--ulimit fsize; the total is
   * measured by the runner).
   */
  fileSizeLimit?: number
  /** docker run --cpus */
  cpus: number
  network: ContainerNetwork
  /** 'deny' (allow_listen: false): every shell command is started with the helper's --deny-listen layer. */
  listen: 'allow' | 'deny'
  labels: Record<string, string>
  /**
   * Names of variables forwarded from the docker CLI's own environment with `-e NAME`: the value
   * reaches the engine through the CLI's environment, never through argv.
   */
  forwardEnv: string[]
  /**
   * The sandbox helper inside the image, when it carries one: agent-run then starts every shell
   * command through it, in a Landlock domain of its own, so a command cannot read agent-run's
   * memory (which holds the agent's secrets) through /proc/PID/mem, nor signal it.
   */
  sandboxHelper?: string
  /** The program inside the container; default the bundled Node. */
  entrypoint?: string
  /** Its arguments; default `agent-run` of the bundled app. */
  command?: string[]
  /**
   * `podman`: the engine is Podman behind its Docker-compatible API, which drops `--ulimit` and the
   * tmpfs `uid=`/`gid=` options: the file size limit is set by a shell before the program starts
   * (no capability in the container can raise it again) and the tmpfs is given to the user with `U`.
   */
  engineKind?: 'docker' | 'podman'
  /** Limits the engine cannot apply, left out of argv (an engine's best_effort: true, see podman-limits.ts). */
  unappliedLimits?: ReadonlyArray<'memory' | 'cpus' | 'pids'>
  /**
   * A host file with `localhost` in it, bound read-only at /etc/hosts when the container is created
   * with no network of the engine's at all (buildCreateRequest): the engine then writes none.
   */
  hostsFile?: string
}

export const CONTAINER_WORKSPACE = '/workspace'
export const CONTAINER_TMP_SIZE = '256m'

const SIZE = /^[0-9]+[kmg]$/i
const ENV_NAME = /^[A-Za-z_][A-Za-z0-9_]*$/

/**
 * argv of `docker run` for one message. No --rm: the host removes the container after reading
 * its exit code and OOMKilled. No value of any secret: argv is visible to every user in `ps`.
 */
export function buildDockerRunArgs(spec: DockerRunSpec): string[] {
  checkRunSpec(spec)
  const user = `${spec.uid}:${spec.gid}`
  const podman = spec.engineKind === 'podman'
  const without = new Set(spec.unappliedLimits ?? [])
  const started = startedProgram(spec)
  return [
    'run',
    '--name',
    spec.name,
    '-i',
    // never reach a registry from a message run; images are built (or pulled) by `container build`
    '--pull',
    'never',
    // stdout carries the reply: keep it off the engine's disk (attach still streams it)
    '--log-driver',
    'none',
    '--read-only',
    '--cap-drop=ALL',
    '--security-opt=no-new-privileges',
    ...(without.has('memory') ? [] : ['--memory', spec.memoryLimit, '--memory-swap', spec.memoryLimit]),
    ...(without.has('pids') ? [] : ['--pids-limit', String(spec.pidsLimit)]),
    ...(without.has('cpus') ? [] : ['--cpus', String(spec.cpus)]),
    ...(spec.fileSizeLimit ? ['--ulimit', `fsize=${spec.fileSizeLimit}`] : []),
    // its own cgroup at /sys/fs/cgroup whatever the engine's default, where agent-run reads OOM kills
    '--cgroupns',
    'private',
    '--init',
    // owned by the run user: with --cap-drop=ALL even root could not write a root-owned 0755 /tmp
    '--tmpfs',
    `/tmp:${tmpfsOptions(spec, podman)}`,
    '--user',
    user,
    '-v',
    `${spec.workspace}:${CONTAINER_WORKSPACE}`,
    '-w',
    CONTAINER_WORKSPACE,
    ...fixedEnv(spec).flatMap((entry) => ['-e', entry]),
    ...spec.forwardEnv.flatMap((name) => ['-e', name]),
    '--network',
    spec.network,
    ...Object.entries(spec.labels).flatMap(([key, value]) => ['--label', `${key}=${value}`]),
    '--entrypoint',
    started[0]!,
    spec.image,
    ...started.slice(1),
  ]
}

/**
 * The Engine API's create body for the same container as buildDockerRunArgs, on a Docker engine,
 * with `network: none` made as NetworkDisabled: a namespace of its own holding only `lo`, which
 * the engine makes without its network stack (that stack's set-up hook runs the whole dockerd
 * binary twice per container: ≈ 80 ms of CPU here, docs/benchmark-history.md). `env` holds the
 * forwarded secrets' values; the body goes to the engine's socket, never to argv.
 */
export function buildCreateRequest(spec: DockerRunSpec & {hostsFile: string}, env: Record<string, string>): object {
  checkRunSpec(spec)
  if (spec.network !== 'none' || spec.engineKind === 'podman' || spec.unappliedLimits?.length)
    throw new Error("buildCreateRequest makes only a Docker engine's network-less container with every limit")
  const started = startedProgram(spec)
  const memory = sizeInBytes(spec.memoryLimit)
  return {
    Image: spec.image,
    Entrypoint: [started[0]],
    Cmd: started.slice(1),
    User: `${spec.uid}:${spec.gid}`,
    WorkingDir: CONTAINER_WORKSPACE,
    Env: [
      ...fixedEnv(spec),
      ...spec.forwardEnv.filter((name) => env[name] !== undefined).map((name) => `${name}=${env[name]}`),
    ],
    Labels: spec.labels,
    OpenStdin: true,
    StdinOnce: true,
    AttachStdin: true,
    AttachStdout: true,
    AttachStderr: true,
    NetworkDisabled: true,
    HostConfig: {
      NetworkMode: 'none',
      LogConfig: {Type: 'none', Config: {}},
      ReadonlyRootfs: true,
      CapDrop: ['ALL'],
      SecurityOpt: ['no-new-privileges'],
      Memory: memory,
      MemorySwap: memory,
      PidsLimit: spec.pidsLimit,
      NanoCpus: Math.round(spec.cpus * 1e9),
      Ulimits: spec.fileSizeLimit ? [{Name: 'fsize', Soft: spec.fileSizeLimit, Hard: spec.fileSizeLimit}] : [],
      CgroupnsMode: 'private',
      Init: true,
      Tmpfs: {'/tmp': tmpfsOptions(spec, false)},
      Binds: [`${spec.workspace}:${CONTAINER_WORKSPACE}`],
      Mounts: [{Type: 'bind', Source: spec.hostsFile, Target: '/etc/hosts', ReadOnly: true}],
    },
  }
}

/** What `/etc/hosts` says in a container made with NetworkDisabled: `localhost`, IPv4 and IPv6, nothing else. */
export const CONTAINER_HOSTS = '127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n'

function checkRunSpec(spec: DockerRunSpec): void {
  if (!SIZE.test(spec.memoryLimit))
    throw new GatewayError('E_CONFIG', `container_mode.memory_limit: "${spec.memoryLimit}" must look like 512m or 2g`)
  if (!Number.isInteger(spec.pidsLimit) || spec.pidsLimit < 1)
    throw new GatewayError(
      'E_CONFIG',
      `container_mode.pids_limit: must be a whole number of at least 1, not ${spec.pidsLimit}`,
    )
  if (spec.workspace.includes(':') || spec.workspace.includes(',')) {
    throw new GatewayError(
      'E_WORKSPACE',
      `the workspace path ${spec.workspace} contains ":" or ",", which docker -v cannot mount`,
      {
        suggestions: ['move MEEPAGATEWAY_HOME to a path without ":" and ","'],
      },
    )
  }
  if (!(spec.cpus > 0))
    throw new GatewayError('E_CONFIG', `container_mode.cpus: must be a number above 0, not ${spec.cpus}`)
  for (const name of spec.forwardEnv) {
    if (!ENV_NAME.test(name))
      throw new GatewayError(
        'E_CONFIG',
        `"${name}" is not a valid environment variable name to forward into the container`,
      )
  }
}

/** The program and its arguments, behind sh's `ulimit -f` on Podman (which drops --ulimit). */
function startedProgram(spec: DockerRunSpec): string[] {
  const program = [spec.entrypoint ?? CONTAINER_NODE, ...(spec.command ?? [`${CONTAINER_APP}/bin/run.js`, 'agent-run'])]
  // sh's `ulimit -f` counts 512-byte blocks; it sets the soft and the hard limit
  return spec.engineKind === 'podman' && spec.fileSizeLimit
    ? ['/bin/sh', '-c', `ulimit -f ${Math.floor(spec.fileSizeLimit / 512)} && exec "$@"`, 'sh', ...program]
    : program
}

function tmpfsOptions(spec: DockerRunSpec, podman: boolean): string {
  return `rw,nosuid,nodev,exec,size=${CONTAINER_TMP_SIZE},${podman ? 'U' : `uid=${spec.uid},gid=${spec.gid}`},mode=0700`
}

/** The variables every run gets, as NAME=value. */
function fixedEnv(spec: DockerRunSpec): string[] {
  return [
    `HOME=${CONTAINER_WORKSPACE}`,
    'TMPDIR=/tmp',
    `${IN_CONTAINER_ENV}=1`,
    ...(spec.sandboxHelper
      ? [`${SANDBOX_HELPER_ENV}=${spec.sandboxHelper}`, `${SANDBOX_LISTEN_ENV}=${spec.listen}`]
      : []),
  ]
}

/** Docker's size (512m, 2g: powers of 1024, as the CLI reads --memory) in bytes. */
function sizeInBytes(size: string): number {
  const unit = {k: 1024, m: 1024 ** 2, g: 1024 ** 3}[size.slice(-1).toLowerCase() as 'k' | 'm' | 'g']
  return Number.parseInt(size, 10) * unit
}

/** A container name from a run id: [a-zA-Z0-9][a-zA-Z0-9_.-]*, at most 63 characters. */
export function containerNameFor(runId: string): string {
  return `meepa-${runId.replace(/[^a-zA-Z0-9_.-]+/g, '-')}`.slice(0, 63)
}
