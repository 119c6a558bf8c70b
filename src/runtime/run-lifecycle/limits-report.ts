import type {AgentConfig, EngineConfig, IsolationLevel} from '../config/types.js'
import {cgroupSupport} from '../../sandbox/run-cgroup.js'
import {keeperHelper} from '../../sandbox/keeper.js'
import {sizeBytes} from '../config/size.js'
import {MIN_VOLUME_BYTES, volumeUnavailable} from '../workspace/volume.js'

/** One line of `sandbox explain`'s resource section: a limit, whether it holds here, and how. */
export interface LimitReport {
  limit: 'memory' | 'pids' | 'cpus' | 'disk' | 'owner'
  value: string
  enforced: boolean
  /** Held by measuring during and after the run (stopped when over), not by the kernel: limits.disk without a volume. */
  measured?: boolean
  how: string
}

/** What limits an agent's runs get at its level on this host (`sandbox explain`). */
export function limitsReport(agent: AgentConfig, level: IsolationLevel, engines: EngineConfig[] = []): LimitReport[] {
  const {limits} = agent
  const keeper = keeperHelper() !== undefined
  const disk = diskReport(limits.disk, level, keeper)
  if (level === 'container') disk.how += onRemoteEngines(agent, engines)
  if (level === 'container') {
    return [
      {
        limit: 'memory',
        value: agent.container_mode.memory_limit,
        enforced: true,
        how: 'docker run --memory (container_mode.memory_limit, default limits.memory)',
      },
      {
        limit: 'pids',
        value: String(agent.container_mode.pids_limit),
        enforced: true,
        how: 'docker run --pids-limit (container_mode.pids_limit, default limits.pids)',
      },
      {
        limit: 'cpus',
        value: String(agent.container_mode.cpus),
        enforced: true,
        how: 'docker run --cpus (container_mode.cpus, default limits.cpus)',
      },
      disk,
      {
        limit: 'owner',
        value: 'keeper',
        enforced: keeper,
        how: keeper
          ? 'the docker client runs under the keeper, which removes the container when the gateway dies; the next start-up removes what is left'
          : 'no keeper (helper not built): the next start-up removes containers of a dead gateway',
      },
    ]
  }
  const support = cgroupSupport()
  const cgroupLine = (
    limit: 'memory' | 'pids' | 'cpus',
    value: string,
    controller: 'memory' | 'pids' | 'cpu',
    what: string,
  ): LimitReport => ({
    limit,
    value,
    enforced: keeper && support.enforced[controller],
    how: !keeper
      ? 'NOT enforced: the sandbox helper (keeper) is not built'
      : support.enforced[controller]
        ? `${what}; ${support.how}`
        : `NOT enforced: ${support.how}`,
  })
  return [
    cgroupLine(
      'memory',
      limits.memory,
      'memory',
      'the kernel OOM-kills inside the run only, and the run ends with E_OOM',
    ),
    cgroupLine(
      'pids',
      String(limits.pids),
      'pids',
      'processes and threads of the run; a fork past it fails, and the run ends with E_LIMIT',
    ),
    cgroupLine('cpus', String(limits.cpus), 'cpu', 'CFS quota: the run gets at most this many CPUs of time'),
    disk,
    {
      limit: 'owner',
      value: 'keeper',
      enforced: keeper,
      how: keeper
        ? "meepa-sandbox stays as the run's keeper: when agent-run exits, the deadline passes or the gateway dies, it kills the run's cgroup, session and every descendant (it is their subreaper)"
        : "NOT enforced: no keeper (helper not built); the run's process group is killed at its end, but a gateway crash leaves it running",
    },
  ]
}

/**
 * limits.disk on the engines a container run may go to that keep the agent's volume themselves
 * (not on this machine's unix socket): a Docker engine holds it as a disk image of its own
 * (container/engine-disk.ts); a Podman engine only bounds what comes back.
 */
function onRemoteEngines(agent: AgentConfig, engines: EngineConfig[]): string {
  const allowed = agent.container_mode.engines
  const remote = engines.filter(
    (engine) =>
      (!allowed || allowed.includes(engine.name)) && (!engine.host?.startsWith('unix://') || engine.kind === 'podman'),
  )
  if (remote.length === 0 || sizeBytes(agent.limits.disk, 'limits.disk') < MIN_VOLUME_BYTES) return ''
  const names = (which: (engine: EngineConfig) => boolean) =>
    remote
      .filter(which)
      .map((engine) => engine.name)
      .join(', ')
  const here = (engine: EngineConfig) => engine.host?.startsWith('unix://') === true
  const docker = names((engine) => engine.kind === 'docker')
  const podmanHere = names((engine) => engine.kind === 'podman' && here(engine))
  const podman = names((engine) => engine.kind === 'podman' && !here(engine))
  return (
    (docker
      ? `; on engine ${docker}: enforced by the kernel there too, the agent's volume being an ext4 image of exactly this size on that engine, attached to a loop device by a setup container of the gateway's (CAP_SYS_ADMIN, loop devices only), mounted nosuid,nodev, and checked by filesystem id before each use (a run there is refused when the engine cannot attach it, unless that engine's best_effort)`
      : '') +
    (podmanHere
      ? `; on Podman engine ${podmanHere} (on this machine): measured during and after the run in the engine's volume here, as a workspace is (rootless Podman cannot attach a loop device), the run stopped with E_DISK when over; each file is capped at this size (ulimit -f)`
      : '') +
    (podman
      ? `; on Podman engine ${podman}: measured on the engine during the run (rootless Podman cannot attach a loop device, and its volume is not on this machine), by a container of the gateway's beside the run reading the volume with du every 2 s, the run stopped with E_DISK when over; what it wrote after the last reading is bounded by what comes back to this machine; each file is capped at this size (ulimit -f)`
      : '')
  )
}

/** limits.disk: the workspace's own filesystem where the gateway can mount one (workspace/volume.ts), else measured. */
function diskReport(value: string, level: IsolationLevel, keeper: boolean): LimitReport {
  const unavailable =
    volumeUnavailable() ?? (sizeBytes(value, 'limits.disk') < MIN_VOLUME_BYTES ? 'the limit is below 1m' : undefined)
  const measuring =
    ` measured during and after the run (${keeper ? 'at any depth, from directory descriptors, a hard-linked file once, allocated blocks (sparse and preallocated files as allocated)' : "by full paths: a tree deeper than the system's path limit counts as over"}; what cannot be measured counts as over), ` +
    'and the run is stopped with E_DISK when over (and the next run refused until files are removed)'
  const fileCap =
    level !== 'container' && keeper
      ? 'each file a run writes is capped at this size (RLIMIT_FSIZE, set by the keeper); '
      : ''
  if (unavailable === undefined) {
    return {
      limit: 'disk',
      value,
      enforced: true,
      measured: false,
      how:
        'enforced by the kernel: the workspace is a filesystem of its own of exactly this size (an ext4 image in the ' +
        "gateway's volumes/, loop-mounted nosuid,nodev on the workspace before any run), so every write past it fails " +
        'with ENOSPC, whatever wrote it' +
        (level === 'container' ? '' : `; ${fileCap}the run's TMPDIR and the workspace together are also${measuring}`),
    }
  }
  return {
    limit: 'disk',
    value,
    enforced: true,
    measured: true,
    how:
      `${fileCap}${level === 'container' ? 'the workspace is' : "the workspace and the run's TMPDIR are"}${measuring}; ` +
      `measured, not enforced by the kernel (no volume per workspace: ${unavailable}): the disk can fill by up to a few seconds of writes before the stop`,
  }
}
