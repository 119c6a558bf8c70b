import fs from 'node:fs'
import {dockerCli, type DockerCli} from '../../sandbox/docker/cli.js'
import {cleanOrphanContainers} from '../../sandbox/docker/containers.js'
import {homeLabel} from '../../sandbox/docker/home-label.js'
import {inspectImage} from '../../sandbox/docker/images.js'
import {shipImages} from '../../sandbox/docker/ship.js'
import {AGENT_ID_PATTERN} from '../config/schema.js'
import type {LoadedConfig} from '../config/types.js'
import {toGatewayError} from '../util/errors.js'
import {withAgentLock} from '../workspace/agent-lock.js'
import {buildContainerImages, type ContainerBuildOptions, type ContainerBuildResult} from './build.js'
import {cleanContainers, type ContainerCleanResult} from './clean.js'
import {removeEngineDisks} from './engine-disk.js'
import {
  engineDiskFile,
  engineDisksVolume,
  engineImagesOf,
  forgetEngineImages,
  recordEngineImages,
  syncStateFile,
  syncVolumePrefix,
} from './engine-state.js'
import {containerStatus, listGatewayImages, type ContainerStatus, type GatewayImage} from './status.js'
import {removeWholeFile} from '../util/write-whole-file.js'

/**
 * The `container` commands over the engines of the `engines:` list (docs/architecture.md,
 * "Engines"): each engine answers for itself, one that does not answer is reported and the others
 * still are, and `clean` touches only this home's objects there.
 */
export interface EngineTarget {
  name: string
  cli: DockerCli
}

/** An engine that did not answer (or refused the whole command): why. */
export interface EngineFailure {
  name: string
  error: string
}

/** Each engine's answer under its name (`name`: a status has an `engine` of its own). */
type PerEngine<T> = Array<({name: string} & T) | EngineFailure>

async function eachEngine<T>(
  targets: EngineTarget[],
  work: (target: EngineTarget) => Promise<T>,
): Promise<PerEngine<T>> {
  const results: PerEngine<T> = []
  for (const target of targets) {
    try {
      results.push({name: target.name, ...(await work(target))})
    } catch (error) {
      results.push({name: target.name, error: toGatewayError(error).message})
    }
  }
  return results
}

export interface EngineBuildResult extends ContainerBuildResult {
  /** `build`: built on the engine itself; `ship`: built here, then copied with save/load. */
  mode: 'build' | 'ship'
  /** Images copied to the engine (ship), by tag. */
  shipped: string[]
}

/**
 * `container build` on each engine that will run the agents' images: built there, or (ship) built
 * on the gateway's own engine and streamed over with `docker save | docker load`; no registry.
 */
export async function buildOnEngines(
  options: Omit<ContainerBuildOptions, 'cli' | 'engine'> & {targets: EngineTarget[]; ship?: boolean},
): Promise<{engines: PerEngine<EngineBuildResult>}> {
  const home = options.loaded.home
  const record = async (target: EngineTarget, tags: string[]) => {
    const ids = await Promise.all(tags.map((tag) => inspectImage(target.cli, tag, options.signal)))
    recordEngineImages(
      home,
      target.name,
      ids.flatMap((info) => (info ? [info.id] : [])),
    )
  }
  const tagsOf = (result: ContainerBuildResult) =>
    result.images.flatMap((entry) => [
      entry.isolation_image.tag,
      ...(entry.container_image ? [entry.container_image.tag] : []),
    ])
  if (!options.ship) {
    const engines = await eachEngine(options.targets, async (target) => {
      options.onLog?.(`engine ${target.name}:`)
      const result = await buildContainerImages({...options, cli: target.cli, engine: target.name})
      await record(target, tagsOf(result))
      return {mode: 'build' as const, shipped: [], ...result}
    })
    return {engines}
  }
  const local = dockerCli()
  const engines = await eachEngine(options.targets, async (target) => {
    options.onLog?.(`engine ${target.name} (built here, shipped):`)
    const result = await buildContainerImages({...options, cli: local, engine: target.name})
    const shipped: string[] = []
    for (const entry of result.images) {
      const tag = entry.isolation_image.tag
      const [here, there] = await Promise.all([
        inspectImage(local, tag, options.signal),
        inspectImage(target.cli, tag, options.signal),
      ])
      if (here && there?.id === here.id) continue
      // the base goes with it: the engine checks the isolation image against it before each run
      options.onLog?.(`shipping ${tag} to engine ${target.name}`)
      await shipImages(local, target.cli, [tag, entry.base], options.signal)
      shipped.push(tag)
    }
    await record(target, tagsOf(result))
    return {mode: 'ship' as const, shipped, ...result}
  })
  return {engines}
}

/** `container status` of each engine: its version, the agents' images there, this home's containers. */
export async function statusOnEngines(
  loaded: LoadedConfig,
  targets: EngineTarget[],
): Promise<{engines: PerEngine<ContainerStatus>}> {
  return {
    engines: await eachEngine(targets, (target) => containerStatus(loaded, {cli: target.cli, engine: target.name})),
  }
}

/** `container images` of each engine. */
export async function imagesOnEngines(
  loaded: LoadedConfig,
  targets: EngineTarget[],
): Promise<{engines: PerEngine<{images: GatewayImage[]}>}> {
  return {
    engines: await eachEngine(targets, async (target) => ({
      images: await listGatewayImages(loaded, {cli: target.cli}),
    })),
  }
}

export interface EngineCleanResult extends ContainerCleanResult {
  /** This home's per-agent workspace volumes removed (the next run there copies the workspace whole). */
  volumes: Array<{name: string; agent: string}>
  kept_volumes: Array<{name: string; reason: string}>
}

/** How long `clean` waits for an agent's run before leaving its volume for next time. */
const VOLUME_LOCK_WAIT_MS = 5_000

/**
 * `container clean` on each engine, of this home's objects only: its containers left behind, its
 * workspace volumes, and the images it built or shipped there (as recorded in engine-state.ts) that
 * nothing uses. Another home's objects and the operator's are never listed.
 */
export async function cleanOnEngines(
  loaded: LoadedConfig,
  targets: EngineTarget[],
  options: {all?: boolean; dryRun?: boolean; signal?: AbortSignal} = {},
): Promise<{engines: PerEngine<EngineCleanResult>}> {
  const home = loaded.home
  const dryRun = options.dryRun === true
  return {
    engines: await eachEngine(targets, async ({name: engine, cli}) => {
      const own = engineImagesOf(home, engine)
      // the containers left behind first: a volume one of them holds could not be removed
      const early = dryRun ? undefined : await cleanOrphanContainers(cli, {home, signal: options.signal})
      const volumes: Pick<EngineCleanResult, 'volumes' | 'kept_volumes'> = {volumes: [], kept_volumes: []}
      await cleanVolumes(home, engine, cli, dryRun, volumes, options.signal)
      if (!dryRun) {
        // the removed volumes' disk images, detached on the engine with an image this home put
        // there, before the image clean below may remove the last of them
        const present = new Set(
          (await listGatewayImages(loaded, {cli, signal: options.signal})).map((image) => image.id),
        )
        const everyVolume = volumes.kept_volumes.length === 0
        const disks = await removeEngineDisks(cli, {
          homeLabel: homeLabel(home),
          agents: everyVolume ? ['*'] : volumes.volumes.map((volume) => volume.agent),
          image: [...own].find((id) => present.has(id)),
          removeVolume: everyVolume,
          signal: options.signal,
        })
        if (disks !== undefined) volumes.kept_volumes.push({name: engineDisksVolume(homeLabel(home)), reason: disks})
      }
      const cleaned = await cleanContainers(loaded, {...options, cli, home, ownImages: own})
      const result: EngineCleanResult = {
        ...cleaned,
        containers: [
          ...(early?.removed ?? []).map(({name, agent, run, state}) => ({name, agent, run, state})),
          ...cleaned.containers,
        ],
        kept_containers: [
          ...(early?.refused ?? []).map(({container, reason}) => ({
            name: container.name,
            reason: `docker refused: ${reason}`,
          })),
          ...cleaned.kept_containers,
        ],
        ...volumes,
      }
      if (!dryRun) {
        const left = new Set((await listGatewayImages(loaded, {cli, signal: options.signal})).map((image) => image.id))
        forgetEngineImages(
          home,
          engine,
          [...own].filter((id) => !left.has(id)),
        )
      }
      return result
    }),
  }
}

const AGENT_ID = new RegExp(AGENT_ID_PATTERN)

/**
 * This home's workspace volumes on the engine, each removed under its agent's lock (never under a
 * run); what the host remembers of it is forgotten first, so the next run copies the workspace whole.
 */
async function cleanVolumes(
  home: string,
  engine: string,
  cli: DockerCli,
  dryRun: boolean,
  result: Pick<EngineCleanResult, 'volumes' | 'kept_volumes'>,
  signal?: AbortSignal,
): Promise<void> {
  const prefix = syncVolumePrefix(homeLabel(home))
  const listed = await cli.check(['volume', 'ls', '--quiet', '--filter', `name=${prefix}`], {signal})
  const volumes = listed.stdout.split('\n').filter((volume) => volume.startsWith(prefix))
  for (const volume of volumes) {
    const agent = volume.slice(prefix.length)
    // the engine's answer names the host files forgotten below: only an agent id is one
    if (!AGENT_ID.test(agent)) {
      result.kept_volumes.push({name: volume, reason: 'its name does not end in an agent id: not made by this gateway'})
      continue
    }
    if (dryRun) {
      result.volumes.push({name: volume, agent})
      continue
    }
    try {
      await withAgentLock(
        home,
        agent,
        async () => {
          // for good: a record back after a crash would be trusted over the new, empty volume
          removeWholeFile(syncStateFile(home, engine, agent))
          fs.rmSync(engineDiskFile(home, engine, agent), {force: true})
          await cli.check(['volume', 'rm', volume], {signal})
        },
        {waitMs: VOLUME_LOCK_WAIT_MS, signal},
      )
      result.volumes.push({name: volume, agent})
    } catch (error) {
      result.kept_volumes.push({name: volume, reason: toGatewayError(error).message.split('\n')[0] ?? 'refused'})
    }
  }
}
