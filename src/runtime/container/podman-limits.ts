import {podmanGet} from './podman-api.js'
import type {EngineConfig} from '../config/types.js'
import {GatewayError, toGatewayError} from '../util/errors.js'
import {settledWithin} from '../util/settled-within.js'

/**
 * Which of a run's limits a Podman engine can apply (docs/architecture.md, "Engines"). Podman's
 * Docker-compatible API accepts `--memory`, `--cpus` and `--pids-limit` even where it cannot
 * apply them (rootless on cgroup v1, or cgroup v2 without the controller delegated to its user)
 * and drops them with a warning in its own log; so the engine is asked once, through its own
 * `libpod/info`, what it runs on, and each limit is decided from that.
 */

export type PodmanLimit = 'memory' | 'cpus' | 'pids'

export interface PodmanHost {
  rootless: boolean
  cgroupVersion: string
  /** The cgroup v2 controllers the engine's user may use (all of them when rootful). */
  controllers: string[]
}

export interface LimitGap {
  limit: PodmanLimit
  /** The config field the limit comes from. */
  field: string
  why: string
}

const FIELD: Record<PodmanLimit, string> = {
  memory: 'container_mode.memory_limit',
  cpus: 'container_mode.cpus',
  pids: 'container_mode.pids_limit',
}
const CONTROLLER: Record<PodmanLimit, string> = {memory: 'memory', cpus: 'cpu', pids: 'pids'}

/** The limits this engine would silently drop, each with why; empty when it applies all of them. */
export function limitGaps(host: PodmanHost): LimitGap[] {
  if (!host.rootless) return []
  const limits: PodmanLimit[] = ['memory', 'cpus', 'pids']
  if (host.cgroupVersion !== 'v2')
    return limits.map((limit) => ({
      limit,
      field: FIELD[limit],
      why: `rootless Podman on cgroup ${host.cgroupVersion} cannot set any resource limit (it needs cgroup v2 with the controller delegated to its user)`,
    }))
  return limits
    .filter((limit) => !host.controllers.includes(CONTROLLER[limit]))
    .map((limit) => ({
      limit,
      field: FIELD[limit],
      why: `the ${CONTROLLER[limit]} cgroup controller is not delegated to the engine's user (it has: ${host.controllers.join(', ') || 'none'}); delegate it (systemd: Delegate=${CONTROLLER[limit]} for user@.service)`,
    }))
}

interface LibpodInfo {
  host?: {cgroupVersion?: string; cgroupControllers?: string[]; security?: {rootless?: boolean}}
}

const INFO_ENDPOINT = '/v4.0.0/libpod/info'

/** Asks the engine what it runs on (its own libpod/info, not the Docker-compatible info). */
export async function podmanHost(engine: EngineConfig, timeoutMs: number): Promise<PodmanHost> {
  let info: LibpodInfo
  try {
    info = JSON.parse(await podmanGet(engine, INFO_ENDPOINT, timeoutMs)) as LibpodInfo
  } catch (error) {
    throw probeFailed(engine, toGatewayError(error).message)
  }
  if (!info.host?.cgroupVersion)
    throw new GatewayError(
      'E_CONFIG',
      `engine ${engine.name} (kind: podman) did not answer ${INFO_ENDPOINT} as Podman`,
      {
        suggestions: ['set kind: docker for a Docker engine'],
      },
    )
  return {
    rootless: info.host.security?.rootless === true,
    cgroupVersion: info.host.cgroupVersion,
    controllers: info.host.cgroupControllers ?? [],
  }
}

const PROBE_TIMEOUT_MS = 5_000
/** The probe is given up this long after its own deadline, however its transport behaves. */
const PROBE_MARGIN_MS = 1_000
const probed = new Map<string, Promise<PodmanHost>>()

/**
 * The engine's host facts, asked once per engine config. A failed ask, or one with no answer by its
 * deadline, is forgotten: the next run asks again instead of waiting on it.
 */
export function probedPodmanHost(engine: EngineConfig): Promise<PodmanHost> {
  const key = JSON.stringify(engine)
  let answer = probed.get(key)
  if (!answer) {
    const asked = settledWithin(podmanHost(engine, PROBE_TIMEOUT_MS), PROBE_TIMEOUT_MS + PROBE_MARGIN_MS, () =>
      probeFailed(engine, `no answer within ${(PROBE_TIMEOUT_MS + PROBE_MARGIN_MS) / 1000} s`),
    )
    answer = asked
    asked.catch(() => {
      if (probed.get(key) === asked) probed.delete(key)
    })
    probed.set(key, asked)
  }
  return answer
}

/**
 * For a run: the probe, waited for no longer than the run may take and not past its cancel (the run
 * holds its agent's lock and a run slot while it waits).
 */
export function podmanHostForRun(
  engine: EngineConfig,
  timeoutMs: number,
  signal: AbortSignal | undefined,
): Promise<PodmanHost> {
  return settledWithin(
    probedPodmanHost(engine),
    timeoutMs,
    () => probeFailed(engine, `no answer within the run's ${timeoutMs / 1000} s`),
    {
      signal,
      cancelled: () =>
        new GatewayError('E_RUN', `the run was cancelled while Podman engine ${engine.name} was asked for its limits`, {
          retryable: true,
        }),
    },
  )
}

function probeFailed(engine: EngineConfig, why: string): GatewayError {
  return new GatewayError(
    'E_DOCKER_DOWN',
    `could not ask Podman engine ${engine.name} which limits it can apply: ${why}`,
    {retryable: true, suggestions: [`check that \`podman system service\` answers at ${engine.host}`]},
  )
}

/** One line per limit: `container_mode.memory_limit (memory): why`. */
export function describeGaps(gaps: readonly LimitGap[]): string {
  return gaps.map((gap) => `${gap.field} (${gap.limit}): ${gap.why}`).join('; ')
}

/** The refusal of a run on an engine that cannot apply some of its limits. */
export function limitsRefused(engine: string, gaps: readonly LimitGap[]): GatewayError {
  return new GatewayError(
    'E_CONFIG',
    `engine ${engine} (Podman) cannot apply ${gaps.map((gap) => gap.limit).join(', ')}, so the run was refused (best_effort: true on the engine would run without them): ${describeGaps(gaps)}`,
    {
      suggestions: [
        `run Podman on cgroup v2 with the controllers delegated, use another engine, or set best_effort: true on engine ${engine} to run without these limits`,
      ],
    },
  )
}

/**
 * For `config check` and `container status`: each limit a Podman engine of the config cannot
 * apply, why, and what its runs do about it (or why the engine could not be asked).
 */
export async function podmanLimitWarnings(
  engines: readonly EngineConfig[] | undefined,
): Promise<Array<{engine: string; warning: string}>> {
  const podmans = (engines ?? []).filter((engine) => engine.kind === 'podman')
  const answers = await Promise.all(
    podmans.map((engine) =>
      probedPodmanHost(engine).then(
        (host) => ({engine, gaps: limitGaps(host)}),
        (error: unknown) => ({engine, error: toGatewayError(error).message}),
      ),
    ),
  )
  return answers.flatMap((answer) => {
    const {engine} = answer
    if ('error' in answer) return [{engine: engine.name, warning: answer.error}]
    const outcome = engine.best_effort
      ? 'best_effort: true, so its runs go without it and say so'
      : 'its runs are refused (best_effort: true would run them without it)'
    return answer.gaps.map((gap) => ({
      engine: engine.name,
      warning: `cannot apply ${gap.field} (${gap.limit}): ${gap.why}; ${outcome}`,
    }))
  })
}
