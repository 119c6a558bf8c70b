import {dockerCli, type DockerCli} from '../../sandbox/docker/cli.js'
import {cleanOrphanContainers, type GatewayContainer} from '../../sandbox/docker/containers.js'
import {localEngineApi} from '../../sandbox/docker/engine-api.js'
import {removeImage} from '../../sandbox/docker/images.js'
import type {LoadedConfig} from '../config/types.js'
import {listGatewayImages, type GatewayImage} from './status.js'

/**
 * Removes containers left behind by a crashed runner, for one gateway home (at start-up) or for
 * every home on the engine (`container clean`). Containers of live runs are never touched.
 * Throws E_DOCKER_* when the engine cannot be reached; the caller decides whether that matters.
 */
export async function removeOrphanContainers(
  options: {home?: string; dryRun?: boolean; cli?: DockerCli; signal?: AbortSignal} = {},
): Promise<GatewayContainer[]> {
  const {removed} = await cleanOrphanContainers(options.cli ?? localEngineApi() ?? dockerCli(), options)
  return removed
}

export interface ContainerCleanResult {
  dry_run: boolean
  containers: Array<Pick<GatewayContainer, 'name' | 'agent' | 'run' | 'state'>>
  /** Containers left behind that the engine would not remove, with why. */
  kept_containers: Array<{name: string; reason: string}>
  images: Array<{ref: string; id: string; size_bytes: number}>
  /** Images that stay, with why (in use by a container, referred to by the config, removal refused). */
  kept: Array<{ref: string; reason: string}>
  reclaimed_bytes: number
}

/**
 * `container clean`: orphan containers, then untagged leftovers of rebuilds and images this config
 * does not refer to (older than CLEAN_GRACE_SECONDS); with `all`, every meepagateway image not used
 * by a container. Idempotent: a second run finds nothing and succeeds.
 */
export async function cleanContainers(
  loaded: LoadedConfig,
  options: {
    all?: boolean
    dryRun?: boolean
    cli?: DockerCli
    signal?: AbortSignal
    /** Only this home's containers (an engine of the `engines:` list: per-engine.ts). */
    home?: string
    /** Only these images, by ID (what this home put on that engine). */
    ownImages?: Set<string>
  } = {},
): Promise<ContainerCleanResult> {
  // a local engine is asked over its API (no docker process per container or image), another through the CLI
  const docker = options.cli ?? localEngineApi() ?? dockerCli()
  const dryRun = options.dryRun === true
  const {removed: containers, refused} = await cleanOrphanContainers(docker, {
    dryRun,
    signal: options.signal,
    home: options.home,
  })
  // In a dry run the orphans still exist; their images count as free, as they will be.
  const images = await listGatewayImages(loaded, {
    cli: options.cli,
    signal: options.signal,
    ignoreContainers: new Set(containers.map((container) => container.id)),
  })
  const result: ContainerCleanResult = {
    dry_run: dryRun,
    containers: containers.map(({name, agent, run, state}) => ({name, agent, run, state})),
    kept_containers: refused.map(({container, reason}) => ({
      name: container.name,
      reason: `docker refused: ${reason}`,
    })),
    images: [],
    kept: [],
    reclaimed_bytes: 0,
  }
  for (const image of images) {
    if (options.ownImages && !options.ownImages.has(image.id)) continue
    const ref = image.tag === '<none>' ? image.id : `${image.repository}:${image.tag}`
    const reason = keepReason(image, options.all === true)
    if (reason) {
      result.kept.push({ref, reason})
      continue
    }
    const refused = dryRun ? undefined : await removeImage(docker, ref, options.signal)
    if (refused !== undefined) {
      result.kept.push({ref, reason: `docker refused: ${refused}`})
      continue
    }
    result.images.push({ref, id: image.id, size_bytes: image.size_bytes})
  }
  // Several tags of one image free its size once.
  result.reclaimed_bytes = [...new Map(result.images.map((image) => [image.id, image.size_bytes])).values()].reduce(
    (sum, size) => sum + size,
    0,
  )
  return result
}

/** Unreferenced tagged images younger than this are kept (without --all): see keepReason. */
export const CLEAN_GRACE_SECONDS = 600

function keepReason(image: GatewayImage, all: boolean): string | undefined {
  if (image.containers > 0) return `used by ${image.containers} container(s)`
  if (all) return undefined
  if (image.used_by.length > 0) return `used by agent ${image.used_by.join(', ')}`
  // Images are shared by every gateway home on the engine, and this config only knows its own
  // agents: a fresh image may belong to another home's build or run that is starting right now.
  if (image.tag !== '<none>' && image.age_seconds < CLEAN_GRACE_SECONDS)
    return `built less than ${CLEAN_GRACE_SECONDS / 60} minutes ago`
  return undefined
}
