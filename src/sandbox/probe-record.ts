import fs from 'node:fs'
import path from 'node:path'

/**
 * A probe's answer remembered across processes, in a file of MEEPAGATEWAY_HOME/cache (which no
 * agent can reach), under a key naming everything the answer depends on, for at most an hour: a
 * CLI start then runs no probe process (nor loads node:child_process for one). What a probe
 * remembers must only ever make a run fail closed if it is wrong (see its caller).
 */
const RECORD_TTL_MS = 60 * 60_000

export function recalled<T>(file: string, key: string): T | undefined {
  try {
    const record = JSON.parse(fs.readFileSync(file, 'utf8')) as {key?: unknown; at?: unknown; answer?: T}
    if (record.key === key && typeof record.at === 'number' && Math.abs(Date.now() - record.at) < RECORD_TTL_MS) return record.answer
  } catch {
    // none yet, damaged or unreadable: probe
  }
  return undefined
}

export function remember(file: string, key: string, answer: unknown): void {
  try {
    fs.mkdirSync(path.dirname(file), {recursive: true, mode: 0o700})
    const temp = `${file}.${process.pid}.tmp`
    fs.writeFileSync(temp, `${JSON.stringify({key, at: Date.now(), answer})}\n`, {mode: 0o600})
    fs.renameSync(temp, file)
  } catch {
    // a read-only home: the next start probes again
  }
}

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
