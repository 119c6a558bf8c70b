import type {DockerCli} from '../../sandbox/docker/cli.js'
import {listGatewayContainers, type GatewayContainer} from '../../sandbox/docker/containers.js'
import {LABEL} from '../../sandbox/docker/dockerfile.js'
import {localEngineApi, type EngineApi} from '../../sandbox/docker/engine-api.js'
import {
  isolationImageState,
  labelledImages,
  planImages,
  type ImageContext,
  type ImagePlan,
} from '../../sandbox/docker/images.js'
import type {AgentConfig, LoadedConfig} from '../config/types.js'
import {containerAgents} from './build.js'
import {containerImageContext, loadDockerCli} from './context.js'
import {toGatewayError} from '../util/errors.js'
import {gatewayHome} from '../util/paths.js'

/** `container status`, `container images` and the "which images does the config use" both need. */

export interface AgentImageStatus {
  agent: string
  container_mode: boolean
  base: string
  container_image?: {tag: string; present: boolean}
  isolation_image: {tag: string; present: boolean; up_to_date: boolean; reason?: string}
  /** Set when the images of this agent could not be worked out (bad base, ...). */
  error?: string
}

export interface ContainerStatus {
  engine: {reachable: true; server_version: string; api_version: string}
  agents: AgentImageStatus[]
  containers: Array<Pick<GatewayContainer, 'name' | 'agent' | 'run' | 'state' | 'created' | 'image'>>
  /** Each limit a Podman engine of the list cannot apply, and what its runs do about it (podman-limits.ts). */
  engine_warnings: Array<{engine: string; warning: string}>
}

/**
 * Engine, images per agent, and the gateway's containers. An unreachable engine throws (exit 10).
 * An engine on a local socket is asked over its API (no docker process at all); otherwise, or
 * when a CLI is given, through the docker CLI. Given a function that loads the config, the
 * Engine API questions that do not depend on it (the ping, the containers) are asked first, and
 * the engine answers them while the config is read and validated.
 */
export async function containerStatus(
  config: LoadedConfig | (() => LoadedConfig),
  options: {cli?: DockerCli; signal?: AbortSignal; engine?: string} = {},
): Promise<ContainerStatus> {
  const engine = options.cli ? undefined : localEngineApi()
  // only Engine API requests go out before the config: a docker CLI process started for a config
  // that turns out invalid could outlive this one
  if (!engine && typeof config === 'function') config = config()
  const docker = engine ?? options.cli ?? (await loadDockerCli())
  // Ask everything at once, then let the ping's clear "engine down" error win over whatever the
  // other calls report.
  const others = new AbortController() // a failed ping stops the rest (a hung engine must not hold us)
  const unread = new AbortController() // a config that cannot be read stops everything
  const signal = AbortSignal.any([...(options.signal ? [options.signal] : []), others.signal, unread.signal])
  const pinging = docker.ping({signal: AbortSignal.any([...(options.signal ? [options.signal] : []), unread.signal])})
  pinging.catch(() => {}) // awaited below, after the config
  const home = typeof config === 'function' ? gatewayHome() : config.home
  const listing = listGatewayContainers(docker, {home, signal})
  listing.catch(() => {}) // awaited below, after the ping
  let loaded: LoadedConfig
  if (typeof config === 'function') {
    // one turn of the event loop puts the requests on their sockets before the config's synchronous read
    await new Promise((resolve) => setImmediate(resolve))
    try {
      loaded = config()
    } catch (error) {
      unread.abort()
      throw error
    }
  } else loaded = config
  const context = containerImageContext(loaded.home, {cli: options.cli, engine, signal})
  const statuses = Promise.all(
    containerAgents(loaded, undefined, options.engine).map((agent) => agentImageStatus(loaded, agent, context)),
  )
  const version = await pinging.catch((error: unknown) => {
    others.abort()
    throw error
  })
  const [agents, listed, engineWarnings] = await Promise.all([
    statuses,
    listing,
    loaded.config.engines?.some((listed) => listed.kind === 'podman')
      ? import('./podman-limits.js').then(({podmanLimitWarnings}) => podmanLimitWarnings(loaded.config.engines))
      : [],
  ])
  const containers = listed.map(({name, agent, run, state, created, image}) => ({
    name,
    agent,
    run,
    state,
    created,
    image,
  }))
  return {
    engine: {reachable: true, server_version: version.server, api_version: version.api},
    agents,
    containers,
    engine_warnings: engineWarnings,
  }
}

async function agentImageStatus(
  loaded: LoadedConfig,
  agent: AgentConfig,
  context: ImageContext,
): Promise<AgentImageStatus> {
  try {
    const plan = await planImages(loaded.config, agent, context)
    const state = await isolationImageState(plan, context)
    return {
      agent: agent.id,
      container_mode: agent.container_mode.enabled,
      base: plan.baseRef,
      ...(plan.container ? {container_image: {tag: plan.container.tag, present: state.base !== undefined}} : {}),
      isolation_image: {
        tag: plan.isolationTag,
        present: state.existing !== undefined,
        up_to_date: state.stale === undefined,
        ...(state.stale ? {reason: state.stale} : {}),
      },
    }
  } catch (error) {
    return {
      agent: agent.id,
      container_mode: true,
      base: '',
      isolation_image: {tag: '', present: false, up_to_date: false},
      error: toGatewayError(error).message,
    }
  }
}

export interface GatewayImage {
  repository: string
  tag: string
  id: string
  kind: string
  size_bytes: number
  created: string
  age_seconds: number
  /** Agents of this config whose runs use it. */
  used_by: string[]
  /** Containers (any state) created from it. */
  containers: number
  in_use: boolean
}

/** Every image with the meepagateway label, with what uses it. */
export async function listGatewayImages(
  loaded: LoadedConfig,
  options: {cli?: DockerCli; signal?: AbortSignal; ignoreContainers?: Set<string>} = {},
): Promise<GatewayImage[]> {
  // a local engine is asked over its API, as by `container status`: no docker process per image
  const engine = options.cli ? undefined : localEngineApi()
  const docker = engine ?? options.cli ?? (await loadDockerCli())
  const infos = await labelledImages(docker, [`${LABEL.gateway}=1`], options.signal)
  if (infos.length === 0) return []
  const [references, containers] = await Promise.all([
    referencedImages(loaded, {cli: options.cli, engine}, options.signal),
    listGatewayContainers(docker, {signal: options.signal}),
  ])
  const images: GatewayImage[] = []
  for (const info of infos) {
    const tags = info.tags.length > 0 ? info.tags : ['<none>:<none>']
    // A rebuilt tag leaves the old image dangling (untagged): it is listed as <none> so clean can remove it.
    for (const ref of tags) {
      const [repository, tag] = splitRef(ref)
      const usedBy = [
        ...new Set(references.filter((reference) => reference.tags.includes(ref)).map((reference) => reference.agent)),
      ]
      const users = containers.filter(
        (container) => !options.ignoreContainers?.has(container.id) && container.imageId === info.id,
      ).length
      images.push({
        repository,
        tag,
        id: info.id,
        kind: info.labels[LABEL.kind] ?? 'unknown',
        size_bytes: info.size,
        created: info.created,
        age_seconds: Math.max(0, Math.round((Date.now() - Date.parse(info.created)) / 1000)),
        used_by: usedBy,
        containers: users,
        in_use: usedBy.length > 0 || users > 0,
      })
    }
  }
  return images.sort((a, b) => a.repository.localeCompare(b.repository) || b.created.localeCompare(a.created))
}

/**
 * The gateway image tags the config refers to, per agent: what `container build` would produce.
 * Works out plans without building; an agent whose plan fails (base missing) refers to nothing.
 */
export async function referencedImages(
  loaded: LoadedConfig,
  docker: {cli?: DockerCli; engine?: EngineApi},
  signal?: AbortSignal,
): Promise<Array<{agent: string; tags: string[]}>> {
  const context = containerImageContext(loaded.home, {...docker, signal})
  const references: Array<{agent: string; tags: string[]}> = []
  for (const agent of containerAgents(loaded)) {
    let plan: ImagePlan
    try {
      plan = await planImages(loaded.config, agent, context)
    } catch {
      continue
    }
    references.push({agent: agent.id, tags: [plan.isolationTag, ...(plan.container ? [plan.container.tag] : [])]})
  }
  return references
}

function splitRef(ref: string): [string, string] {
  const at = ref.lastIndexOf(':')
  return at > ref.lastIndexOf('/') ? [ref.slice(0, at), ref.slice(at + 1)] : [ref, 'latest']
}
