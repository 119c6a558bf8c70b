import fs from 'node:fs'
import type {RecallOptions} from '../runtime/util/remembered.js'

/**
 * How long a host probe's remembered answer (src/runtime/util/remembered.ts) holds: an hour. What
 * a probe remembers must only ever make a run fail closed if it is wrong (see its caller).
 */
export const PROBE_RECORD: RecallOptions = {maxAgeMs: 60 * 60_000}

/** This boot's id: another boot may run another kernel, sysctls or binaries. */
export function bootId(): string | null {
  return readSmallFile('/proc/sys/kernel/random/boot_id')
}

/** A file's identity and version, or undefined when it cannot be stat'ed. */
export function fileIdentity(file: string): number[] | undefined {
  try {
    const stat = fs.statSync(file)
    return [stat.dev, stat.ino, stat.size, stat.mtimeMs, stat.mode]
  } catch {
    return undefined
  }
}

export function readSmallFile(file: string): string | null {
  try {
    return fs.readFileSync(file, 'utf8').trim()
  } catch {
    return null
  }
}
