import fs from 'node:fs'
import path from 'node:path'
import {sha256} from '../../sandbox/docker/dockerfile.js'
import {writeWholeFile} from '../util/write-whole-file.js'
import {engineSyncDir} from '../util/paths.js'
import {validateAgentId} from '../workspace/location.js'

/**
 * What this gateway home put on each engine of its `engines:` list, so that `container clean`
 * removes its own objects there and never another home's or the operator's: the images it built
 * or shipped (recorded here by ID), and the per-agent workspace volumes (named after the home).
 */

/** The engine-side workspace volumes of one home all start with this (docs/architecture.md, "Engines"). */
export function syncVolumePrefix(homeLabel: string): string {
  return `meepa-ws-${sha256(homeLabel).slice(0, 12)}-`
}

/** Where the host remembers what an agent's volume on an engine holds (workspace-sync.ts). */
export function syncStateFile(home: string, engine: string, agentId: string): string {
  return path.join(engineSyncDir(home), engine, `${validateAgentId(agentId)}.json`)
}

/** Where the host remembers an agent's disk image on an engine (engine-disk.ts). */
export function engineDiskFile(home: string, engine: string, agentId: string): string {
  return path.join(engineSyncDir(home), engine, `${validateAgentId(agentId)}.disk.json`)
}

/** The engine-side volume holding this home's workspace disk images (engine-disk.ts). */
export function engineDisksVolume(homeLabel: string): string {
  return `meepa-disks-${sha256(homeLabel).slice(0, 12)}`
}

function imagesFile(home: string, engine: string): string {
  return path.join(home, 'cache', 'engine-images', `${engine}.json`)
}

/** The image IDs this home built or shipped on an engine. */
export function engineImagesOf(home: string, engine: string): Set<string> {
  try {
    return new Set(JSON.parse(fs.readFileSync(imagesFile(home, engine), 'utf8')) as string[])
  } catch {
    return new Set()
  }
}

/** Adds image IDs to the engine's record; writes only when one is new. */
export function recordEngineImages(home: string, engine: string, ids: string[]): void {
  const known = engineImagesOf(home, engine)
  if (ids.every((id) => known.has(id))) return
  for (const id of ids) known.add(id)
  fs.mkdirSync(path.dirname(imagesFile(home, engine)), {recursive: true, mode: 0o700})
  writeWholeFile(imagesFile(home, engine), JSON.stringify([...known]))
}

/** Drops image IDs from the record (removed from the engine). */
export function forgetEngineImages(home: string, engine: string, ids: string[]): void {
  const known = engineImagesOf(home, engine)
  if (!ids.some((id) => known.delete(id))) return
  writeWholeFile(imagesFile(home, engine), JSON.stringify([...known]))
}
