import fs from 'node:fs'
import path from 'node:path'
import {homeLabel} from '../../../sandbox/docker/home-label.js'
import {LABEL} from '../../../sandbox/docker/dockerfile.js'
import type {DockerCli} from '../../../sandbox/docker/cli.js'
import {attachEngineDisk, readEngineDisk, type EngineDisk} from '../../container/engine-disk.js'
import {sizeBytes} from '../../config/size.js'
import {MIN_VOLUME_BYTES} from '../../workspace/volume.js'
import type {RunRequest} from '../types.js'
import type {DockerEngine} from './engines.js'
import {forgetVolume, type SyncedVolume} from './workspace-sync.js'

/** The disk image's size for the agent's limits.disk on a sync engine; undefined where that engine keeps none. */
function diskBytesOn(request: RunRequest, engine: DockerEngine): number | undefined {
  // rootless Podman cannot attach a loop device: there limits.disk bounds what comes back (docs/architecture.md)
  if (engine.workspace !== 'sync' || engine.config?.kind === 'podman') return undefined
  const bytes = sizeBytes(request.input.agent.limits.disk, 'limits.disk')
  if (bytes < MIN_VOLUME_BYTES) return undefined
  return bytes - (bytes % 4096)
}

/**
 * The agent's disk image on a sync engine before a run (engine-disk.ts): as recorded when its
 * volume is known; else attached (made, checked) first, the volume then sent whole. A Docker
 * engine that cannot attach it refuses the run, unless its best_effort says run without.
 */
export async function agentDiskFor(
  request: RunRequest,
  engine: DockerEngine,
  cli: DockerCli,
  sync: SyncedVolume,
  image: string,
  log: (line: string) => void,
): Promise<EngineDisk | undefined> {
  const bytes = diskBytesOn(request, engine)
  if (bytes === undefined) return undefined
  const agentId = request.input.agent.id
  const known = readEngineDisk(request.home, engine.name, agentId)
  if (known?.device && known.bytes === bytes && sync.synced) return known
  forgetVolume(sync) // a new image, or one attached anew: its content is not known
  try {
    const disk = await attachEngineDisk(cli, {
      home: request.home,
      engine: engine.name,
      homeLabel: homeLabel(request.home),
      agentId,
      volume: sync.volume,
      bytes,
      image,
      labels: {
        [LABEL.gateway]: '1',
        [LABEL.home]: homeLabel(request.home),
        [LABEL.pid]: String(process.pid),
        [LABEL.run]: 'disk-setup',
      },
      signal: request.signal,
    })
    log(
      `limits.disk: agent ${agentId}'s volume on engine ${engine.name} is its ${bytes}-byte filesystem (${disk.device})`,
    )
    return disk
  } catch (error) {
    if (!engine.config?.best_effort) throw error
    log(
      `best effort: engine ${engine.name} runs this message WITHOUT a hard limits.disk on its volume (best_effort: true): ${(error as Error).message}`,
    )
    return undefined
  }
}

/** What a standby there must check, or false when none should start yet (its image not attached, or another size). */
export function agentDiskForStandby(request: RunRequest, engine: DockerEngine): EngineDisk | undefined | false {
  const bytes = diskBytesOn(request, engine)
  if (bytes === undefined) return undefined
  const known = readEngineDisk(request.home, engine.name, request.input.agent.id)
  return known?.device && known.bytes === bytes ? known : false
}

/** Volume paths on this machine, by engine and volume: a volume's mount point does not move. */
const volumesHere = new Map<string, string>()

/**
 * Where a Podman engine of this machine (a unix:// socket) keeps the agent's volume, for limits.disk
 * to be measured there during the run as a workspace is (rootless Podman cannot attach a disk
 * image); undefined for any other engine, or a path this process cannot see.
 */
export async function podmanVolumeHere(
  cli: DockerCli,
  engine: DockerEngine,
  volume: string,
): Promise<string | undefined> {
  if (engine.config?.kind !== 'podman' || !engine.config.host?.startsWith('unix://')) return undefined
  const key = `${engine.name}/${volume}`
  const known = volumesHere.get(key)
  if (known && fs.existsSync(known)) return known
  const inspected = await cli.exec(['volume', 'inspect', '--format', '{{.Mountpoint}}', volume])
  const dir = inspected.stdout.trim()
  // Podman keeps a volume at <its volume path>/<name>/_data: any other answer (`/`, a home) would
  // have the gateway walk a folder that is not the volume
  const shaped = path.isAbsolute(dir) && dir.endsWith(`/${volume}/_data`) && path.normalize(dir) === dir
  if (inspected.exitCode !== 0 || !shaped || !fs.existsSync(dir)) return undefined
  volumesHere.set(key, dir)
  return dir
}
