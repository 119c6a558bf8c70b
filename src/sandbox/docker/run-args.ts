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
  const user = `${spec.uid}:${spec.gid}`
  const podman = spec.engineKind === 'podman'
  const without = new Set(spec.unappliedLimits ?? [])
  const program = [spec.entrypoint ?? CONTAINER_NODE, ...(spec.command ?? [`${CONTAINER_APP}/bin/run.js`, 'agent-run'])]
  // sh's `ulimit -f` counts 512-byte blocks; it sets the soft and the hard limit
  const started =
    podman && spec.fileSizeLimit
      ? ['/bin/sh', '-c', `ulimit -f ${Math.floor(spec.fileSizeLimit / 512)} && exec "$@"`, 'sh', ...program]
      : program
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
    `/tmp:rw,nosuid,nodev,exec,size=${CONTAINER_TMP_SIZE},${podman ? 'U' : `uid=${spec.uid},gid=${spec.gid}`},mode=0700`,
    '--user',
    user,
    '-v',
    `${spec.workspace}:${CONTAINER_WORKSPACE}`,
    '-w',
    CONTAINER_WORKSPACE,
    '-e',
    `HOME=${CONTAINER_WORKSPACE}`,
    '-e',
    'TMPDIR=/tmp',
    '-e',
    `${IN_CONTAINER_ENV}=1`,
    ...(spec.sandboxHelper
      ? ['-e', `${SANDBOX_HELPER_ENV}=${spec.sandboxHelper}`, '-e', `${SANDBOX_LISTEN_ENV}=${spec.listen}`]
      : []),
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

/** A container name from a run id: [a-zA-Z0-9][a-zA-Z0-9_.-]*, at most 63 characters. */
export function containerNameFor(runId: string): string {
  return `meepa-${runId.replace(/[^a-zA-Z0-9_.-]+/g, '-')}`.slice(0, 63)
}
