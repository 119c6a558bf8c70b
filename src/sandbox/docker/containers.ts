import {processAlive} from '../../runtime/util/process-alive.js'
import type {DockerCli} from './cli.js'
import {LABEL} from './dockerfile.js'
import {EngineApi} from './engine-api.js'
import {homeLabel} from './home-label.js'
import {cliRefusal} from './errors.js'

/**
 * The gateway's containers, found by label. A message's container is removed by the runner that
 * started it; one whose runner died (gateway crashed, `send` killed) is an orphan, removed at
 * start-up and by `container clean`. A container still running for a live gateway is never one.
 */
export interface GatewayContainer {
  id: string
  name: string
  /** The image reference it was started from. */
  image: string
  /** The image ID it runs (stays right when the reference is re-tagged). */
  imageId: string
  state: string
  running: boolean
  created: string
  agent?: string
  run?: string
  /** The gateway home it belongs to (hashed, see homeLabel). */
  home?: string
  /** The host process that started it and will remove it. */
  ownerPid?: number
}

/** The gateway's containers (of one home, when given), asked over the Engine API or through the docker CLI. */
export async function listGatewayContainers(
  docker: DockerCli | EngineApi,
  options: {home?: string; signal?: AbortSignal} = {},
): Promise<GatewayContainer[]> {
  const labels = [`${LABEL.gateway}=1`, ...(options.home ? [`${LABEL.home}=${homeLabel(options.home)}`] : [])]
  const raw =
    docker instanceof EngineApi
      ? await docker.containers(labels, {signal: options.signal})
      : await inspectLabelledContainers(docker, labels, options.signal)
  return raw.map(toGatewayContainer)
}

async function inspectLabelledContainers(
  cli: DockerCli,
  labels: string[],
  signal?: AbortSignal,
): Promise<RawContainer[]> {
  const filters = labels.flatMap((label) => ['--filter', `label=${label}`])
  const ids = (await cli.check(['ps', '-a', '-q', '--no-trunc', ...filters], {signal})).stdout
    .split('\n')
    .filter(Boolean)
  if (ids.length === 0) return []
  // A container may disappear between ps and inspect (its runner removed it): inspect prints the rest.
  const result = await cli.exec(['container', 'inspect', ...ids], {signal})
  return result.stdout.trim() ? (JSON.parse(result.stdout) as RawContainer[]) : []
}

/**
 * What `docker container inspect` (and the Engine API's /containers/{id}/json) says of a container,
 * as far as it is read.
 */
export interface RawContainer {
  Id: string
  Name: string
  Created: string
  Image: string
  State: {Status: string; Running: boolean}
  Config: {Image: string; Labels: Record<string, string> | null}
}

function toGatewayContainer(raw: RawContainer): GatewayContainer {
  const labels = raw.Config.Labels ?? {}
  const pid = Number(labels[LABEL.pid])
  return {
    id: raw.Id,
    name: raw.Name.replace(/^\//, ''),
    image: raw.Config.Image,
    imageId: raw.Image,
    state: raw.State.Status,
    running: raw.State.Running,
    created: raw.Created,
    agent: labels[LABEL.agent],
    run: labels[LABEL.run],
    home: labels[LABEL.home],
    ownerPid: Number.isInteger(pid) && pid > 0 ? pid : undefined,
  }
}

/** How long a live runner's container may stay `created` before it counts as left behind. */
export const STARTING_GRACE_MS = 60_000

/**
 * Left behind: not running (nobody will read or remove it), or running for a runner process
 * that no longer exists. Probes and builds carry no owner and are only orphans once stopped. A
 * container `created` less than a minute ago for a live runner is being started (created over
 * the API, then `docker start`): not one.
 */
export function isOrphan(
  container: GatewayContainer,
  isAlive: (pid: number) => boolean = processAlive,
  now = Date.now(),
): boolean {
  if (
    container.state === 'created' &&
    container.ownerPid !== undefined &&
    now - Date.parse(container.created) < STARTING_GRACE_MS &&
    isAlive(container.ownerPid)
  )
    return false
  if (!container.running) return true
  return container.ownerPid !== undefined && !isAlive(container.ownerPid)
}

/** `docker rm -f` for many containers in one call; a container already gone is not an error. */
export async function removeContainers(
  docker: DockerCli | EngineApi,
  ids: string[],
  signal?: AbortSignal,
): Promise<void> {
  if (ids.length === 0) return
  if (docker instanceof EngineApi) await Promise.all(ids.map((id) => docker.removeContainer(id, {signal})))
  else await docker.exec(['rm', '--force', '--volumes', ...ids], {signal})
}

/**
 * `docker rm --force --volumes` of each container, one already gone included: why the engine
 * refused each one it did not remove. One refusal does not stop the others; an engine that
 * cannot be reached (or does not answer) throws.
 */
async function removeEachContainer(
  docker: DockerCli | EngineApi,
  ids: string[],
  signal?: AbortSignal,
): Promise<Map<string, string>> {
  const refused = new Map<string, string>()
  if (docker instanceof EngineApi) {
    const results = await Promise.allSettled(ids.map((id) => docker.removeContainer(id, {signal})))
    for (const [i, result] of results.entries()) {
      if (result.status === 'fulfilled') continue
      const reason = (result.reason as {details?: {reason?: unknown}}).details?.reason
      if (typeof reason !== 'string') throw result.reason
      refused.set(ids[i]!, reason)
    }
    return refused
  }
  if (ids.length === 0 || (await docker.exec(['rm', '--force', '--volumes', ...ids], {signal})).exitCode === 0)
    return refused
  // which of them: each alone (the CLI's exit says only that one failed)
  for (const id of ids) {
    const alone = await docker.exec(['rm', '--force', '--volumes', id], {signal})
    if (alone.exitCode !== 0 && !/no such container/i.test(alone.stderr)) refused.set(id, cliRefusal(alone.stderr))
  }
  return refused
}

export interface OrphanCleanup {
  removed: GatewayContainer[]
  /** Orphans the engine would not remove, with why. */
  refused: Array<{container: GatewayContainer; reason: string}>
  kept: GatewayContainer[]
}

/** Finds and (unless dryRun) removes orphans of one home, or of every home when none is given. */
export async function cleanOrphanContainers(
  docker: DockerCli | EngineApi,
  options: {home?: string; dryRun?: boolean; signal?: AbortSignal} = {},
): Promise<OrphanCleanup> {
  const containers = await listGatewayContainers(docker, options)
  const orphans = containers.filter((container) => isOrphan(container))
  const refusals = options.dryRun
    ? new Map<string, string>()
    : await removeEachContainer(
        docker,
        orphans.map((container) => container.id),
        options.signal,
      )
  const removed = orphans.filter((container) => !refusals.has(container.id))
  const refused = orphans.flatMap((container) =>
    refusals.has(container.id) ? [{container, reason: refusals.get(container.id)!}] : [],
  )
  return {removed, refused, kept: containers.filter((container) => !orphans.includes(container))}
}
