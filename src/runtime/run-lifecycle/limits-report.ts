import type {AgentConfig, IsolationLevel} from '../config/types.js'
import {cgroupSupport} from '../../sandbox/run-cgroup.js'
import {keeperHelper} from '../../sandbox/keeper.js'

/** One line of `sandbox explain`'s resource section: a limit, whether it holds here, and how. */
export interface LimitReport {
  limit: 'memory' | 'pids' | 'cpus' | 'disk' | 'owner'
  value: string
  enforced: boolean
  /** Held by measuring during and after the run (stopped when over), not by the kernel: limits.disk without a quota. */
  measured?: boolean
  how: string
}

/** What limits an agent's runs get at its level on this host (`sandbox explain`). */
export function limitsReport(agent: AgentConfig, level: IsolationLevel): LimitReport[] {
  const {limits} = agent
  const keeper = keeperHelper() !== undefined
  const disk: LimitReport = {
    limit: 'disk',
    value: limits.disk,
    enforced: true,
    measured: true,
    how:
      (level !== 'container' && keeper
        ? 'each file a run writes is capped at this size (RLIMIT_FSIZE, set by the keeper); '
        : '') +
      (level === 'container' ? 'the workspace is' : "the workspace and the run's TMPDIR are") +
      ` measured during and after the run (${keeper ? 'at any depth, from directory descriptors' : "by full paths: a tree deeper than the system's path limit counts as over"}; what cannot be measured counts as over), ` +
      'and the run is stopped with E_DISK when over (and the next run refused until files are removed); ' +
      'measured, not enforced by the kernel (no filesystem quota): the disk can fill by up to a few seconds of writes before the stop',
  }
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
