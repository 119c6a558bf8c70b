import {DockerCli, dockerCli} from '../../../sandbox/docker/cli.js'
import type {EngineConfig, GatewayConfig} from '../../config/types.js'
import {GatewayError, toGatewayError} from '../../util/errors.js'
import {pingPodman} from '../../container/podman-api.js'
import {resolveContext} from '../../container/engine-context.js'
import type {EngineView} from '../../shapes/engine-view.js'
import {
  dockerEngineProblem,
  engineStates,
  engineVersion,
  markEngineDown,
  markEngineUp,
  noteEngineVersion,
} from './engine-health.js'
import {sshEnvOf} from '../../container/engine-ssh.js'
import {settledWithin} from '../../util/settled-within.js'

/**
 * Where container runs go (docs/architecture.md, "Engines"). The runner asks only this of an
 * engine, so another kind of place to run (a Kubernetes cluster: docs/kubernetes.md) implements
 * the same shape without the gateway changing.
 */
export interface RunEngine {
  readonly name: string
  /** Runs at once; a full engine gets no new run. */
  readonly maxRuns: number
  /**
   * How a run's workspace reaches it: `bind` mounts the host path (an engine on this machine);
   * `sync` keeps an engine-side volume per agent in step with it (workspace-sync.ts).
   */
  readonly workspace: 'bind' | 'sync'
  /** Resolves when the engine answers within `timeoutMs`; throws a GatewayError saying why not. */
  ping(timeoutMs: number): Promise<void>
}

/** A Docker engine, driven through the docker CLI with its `--host`/TLS flags. */
export interface DockerEngine extends RunEngine {
  readonly cli: DockerCli
  /** Its `engines:` entry; unset for the local engine without the list. */
  readonly config?: EngineConfig
}

/** The name of the engine runs use when the config has no `engines:` list. */
export const LOCAL_ENGINE = 'local'

/** An ssh:// engine's answer includes an ssh login (and a docker on the far side): it may take this long. */
const SSH_PING_MIN_MS = 5_000

function dockerEngine(
  name: string,
  cli: DockerCli,
  workspace: 'bind' | 'sync',
  maxRuns: number,
  extra: {config?: EngineConfig; pingMinMs?: number} = {},
): DockerEngine {
  return {
    name,
    cli,
    workspace,
    maxRuns,
    ...(extra.config ? {config: extra.config} : {}),
    ping:
      extra.config?.kind === 'podman'
        ? async (timeoutMs) =>
            noteEngineVersion(
              name,
              await pingPodman(extra.config as EngineConfig, Math.max(timeoutMs, extra.pingMinMs ?? 0)),
            )
        : async (timeoutMs) =>
            noteEngineVersion(name, (await cli.ping({timeoutMs: Math.max(timeoutMs, extra.pingMinMs ?? 0)})).server),
  }
}

/** The docker CLI's global flags for an engine: its host and, over tcp://, the mutual TLS files (paths only). */
export function engineArgsOf(engine: Pick<EngineConfig, 'host' | 'tls'> & Partial<EngineConfig>): string[] {
  const host = ['--host', engine.host as string]
  if (!engine.tls) return host
  return [
    ...host,
    '--tlsverify',
    '--tlscacert',
    engine.tls.ca,
    '--tlscert',
    engine.tls.cert,
    '--tlskey',
    engine.tls.key,
  ]
}

/**
 * One entry of the `engines:` list: a context read as its host and TLS (src/runtime/container/engine-context.ts), an
 * ssh:// host reached through the ssh wrapper (engine-ssh.ts). A context that cannot be read is
 * down, with why, until the config changes.
 */
function listedEngine(listed: EngineConfig): DockerEngine {
  let engine: EngineConfig
  try {
    engine = listed.context === undefined ? listed : resolveContext(listed)
  } catch (error) {
    const failed = toGatewayError(error)
    markEngineDown(listed.name, failed.message)
    const unusable = dockerEngine(
      listed.name,
      new DockerCli({engineArgs: ['--context', listed.context as string]}),
      'sync',
      listed.max_runs,
    )
    return {...unusable, ping: () => Promise.reject(failed)}
  }
  const host = engine.host as string
  const cli = new DockerCli({
    engineArgs: engineArgsOf(engine),
    ...(host.startsWith('ssh://') ? {engineEnv: sshEnvOf(engine)} : {}),
  })
  // a unix socket is on this machine: it can mount the host's workspace path; anything else gets the
  // sync, and so does rootless Podman, whose user can neither reach the gateway's home nor own its files
  const workspace = host.startsWith('unix://') && engine.kind !== 'podman' ? 'bind' : 'sync'
  return dockerEngine(listed.name, cli, workspace, listed.max_runs, {
    config: engine,
    pingMinMs: host.startsWith('ssh://') ? SSH_PING_MIN_MS : 0,
  })
}

let built: {key: string; engines: DockerEngine[]} | undefined

/** The engines of this config (the local one alone without `engines:`), the same objects while it is unchanged. */
export function enginesOf(config: GatewayConfig): DockerEngine[] {
  const key = JSON.stringify(config.engines ?? [])
  if (built?.key === key) return built.engines
  const engines =
    config.engines && config.engines.length > 0
      ? config.engines.map(listedEngine)
      : [dockerEngine(LOCAL_ENGINE, dockerCli(), 'bind', Number.POSITIVE_INFINITY)]
  built = {key, engines}
  return engines
}

/**
 * The engines a `container` command acts on: every one of the config, or the one `--engine` names
 * (an unknown name is refused with the configured ones).
 */
export function selectEngines(config: GatewayConfig, name: string | undefined): DockerEngine[] {
  const engines = enginesOf(config)
  if (name === undefined) return engines
  const chosen = engines.filter((engine) => engine.name === name)
  if (chosen.length > 0) return chosen
  throw new GatewayError('E_USAGE', `there is no engine named "${name}"`, {
    suggestions: [`use one of the configured engines: ${engines.map((engine) => engine.name).join(', ')}`],
  })
}

const activeRuns = new Map<string, number>()

/** Runs placed on each engine and not yet finished. */
export function activeRunsOn(name: string): number {
  return activeRuns.get(name) ?? 0
}

/**
 * The engine a run goes to: within the agent's allowed engines, a healthy one with room, fewest
 * active runs first (the config's order breaks ties). The returned `release` ends its count.
 */
export function placeRun(
  engines: readonly DockerEngine[],
  allowed: readonly string[] | undefined,
): {engine: DockerEngine; release: () => void} {
  const engine = nextPlacement(engines, allowed)
  if (!engine) throw noEngine(engines, allowed)
  activeRuns.set(engine.name, activeRunsOn(engine.name) + 1)
  let released = false
  return {
    engine,
    release: () => {
      if (released) return
      released = true
      activeRuns.set(engine.name, activeRunsOn(engine.name) - 1)
    },
  }
}

/**
 * Where the agent's next run would go now, counting nothing (its standby is made there); undefined
 * when nowhere. `ending`: the engine of a run that answered and is ending, not counted as busy.
 */
export function nextPlacement(
  engines: readonly DockerEngine[],
  allowed: readonly string[] | undefined,
  ending?: string,
): DockerEngine | undefined {
  const states = engineStates()
  const runs = (engine: DockerEngine) => activeRunsOn(engine.name) - (engine.name === ending ? 1 : 0)
  let best: DockerEngine | undefined
  for (const engine of engines) {
    if (allowed && !allowed.includes(engine.name)) continue
    if (states.get(engine.name)?.down || runs(engine) >= engine.maxRuns) continue
    if (!best || runs(engine) < runs(best)) best = engine
  }
  return best
}

function noEngine(engines: readonly DockerEngine[], allowed: readonly string[] | undefined): GatewayError {
  const states = engineStates()
  const why = engines
    .filter((engine) => !allowed || allowed.includes(engine.name))
    .map((engine) => {
      const down = states.get(engine.name)?.down
      return down ? `${engine.name} is down (${down.reason})` : `${engine.name} is full (${engine.maxRuns} runs)`
    })
  return new GatewayError('E_DOCKER_DOWN', `no engine can take the run: ${why.join('; ') || 'none is allowed'}`, {
    retryable: true,
    suggestions: ["send the message again later, or allow more engines in the agent's container_mode.engines"],
  })
}

/**
 * Each engine runs may go to: its health (the watch's last answer), active runs, standby
 * containers ready there and version.
 */
export function engineViews(config: GatewayConfig, standbysOn: (engine: string) => number): EngineView[] {
  const listed = Boolean(config.engines?.length)
  watchEngines(config) // asked before any run: the page shows each engine's health from the start
  return enginesOf(config).map((engine) => {
    const down = listed ? engineStates().get(engine.name)?.down : dockerEngineProblem()
    const known = listed
      ? engineStates().has(engine.name)
      : down !== undefined || engineVersion(engine.name) !== undefined
    const version = engineVersion(engine.name)
    return {
      name: engine.name,
      health: down ? 'down' : known ? 'up' : 'unknown',
      ...(down ? {problem: down.reason, down_since: new Date(down.since).toISOString()} : {}),
      active_runs: activeRunsOn(engine.name),
      max_runs: Number.isFinite(engine.maxRuns) ? engine.maxRuns : null,
      standbys: standbysOn(engine.name),
      ...(version ? {version} : {}),
    }
  })
}

/** How often each configured engine is asked whether it answers, and how long the answer may take. */
const ENGINE_WATCH_INTERVAL_MS = 1_000
const ENGINE_WATCH_TIMEOUT_MS = 2_000
/** When the watch stops waiting for a ping, whatever its transport does. */
const ENGINE_WATCH_GIVE_UP_MS = Math.max(ENGINE_WATCH_TIMEOUT_MS, SSH_PING_MIN_MS) + 1_000

let watched: {key: string; timer: NodeJS.Timeout; pinging: Set<string>} | undefined

/**
 * Asks every engine of the `engines:` list once a second: one that does not answer within 2 s is
 * marked down (new runs go elsewhere, /healthz names it), one that answers again is used again.
 * Nothing to watch without the list: the local engine keeps its own probe (engine-probe.ts).
 */
export function watchEngines(config: GatewayConfig): void {
  if (!config.engines || config.engines.length === 0) return
  const key = JSON.stringify(config.engines)
  if (watched?.key === key) return
  stopWatchingEngines()
  const engines = enginesOf(config)
  const pinging = new Set<string>()
  const tick = () => {
    for (const engine of engines) {
      if (pinging.has(engine.name)) continue
      pinging.add(engine.name)
      // a ping that never settles must not leave the engine's last state standing: past its own
      // deadline (an ssh engine's is longer) and a margin, it counts as no answer
      void settledWithin(
        engine.ping(ENGINE_WATCH_TIMEOUT_MS),
        ENGINE_WATCH_GIVE_UP_MS,
        () => new Error(`no answer to its ping within ${ENGINE_WATCH_GIVE_UP_MS / 1000} s`),
      )
        .then(
          () => markEngineUp(engine.name),
          (error: unknown) => markEngineDown(engine.name, toGatewayError(error).message.split('\n')[0] ?? 'no answer'),
        )
        .finally(() => pinging.delete(engine.name))
    }
  }
  tick()
  watched = {key, timer: setInterval(tick, ENGINE_WATCH_INTERVAL_MS).unref(), pinging}
}

export function stopWatchingEngines(): void {
  if (watched) clearInterval(watched.timer)
  watched = undefined
}
