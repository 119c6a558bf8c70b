import fs from 'node:fs'
import path from 'node:path'

/**
 * A probe's answer remembered across processes, in a file of MEEPAGATEWAY_HOME/cache (which no
 * agent can reach), under a key naming everything the answer depends on, for at most an hour: a
 * CLI start then runs no probe process (nor loads node:child_process for one). What a probe
 * remembers must only ever make a run fail closed if it is wrong (see its caller).
 */
const RECORD_TTL_MS = 60 * 60_000

/** Larger than any record: a file past it is not one. */
const MAX_RECORD_BYTES = 64 * 1024

export function recalled<T>(file: string, key: string): T | undefined {
  try {
    const record = JSON.parse(readRecord(file)) as {key?: unknown; at?: unknown; answer?: T}
    if (record.key === key && typeof record.at === 'number' && Math.abs(Date.now() - record.at) < RECORD_TTL_MS) return record.answer
  } catch {
    // none yet, damaged, unreadable or not a regular file: probe
  }
  return undefined
}

/** The record's text: never through a symlink, never blocking on a FIFO or a device, never unbounded. */
function readRecord(file: string): string {
  const fd = fs.openSync(file, fs.constants.O_RDONLY | fs.constants.O_NOFOLLOW | fs.constants.O_NONBLOCK)
  try {
    const stat = fs.fstatSync(fd)
    if (!stat.isFile() || stat.size > MAX_RECORD_BYTES) throw new Error(`${file} is not a probe record`)
    const buffer = Buffer.alloc(stat.size)
    return buffer.subarray(0, fs.readSync(fd, buffer, 0, stat.size, 0)).toString('utf8')
  } finally {
    fs.closeSync(fd)
  }
}

export function remember(file: string, key: string, answer: unknown): void {
  // unguessable enough, and O_EXCL refuses a name that exists (node:crypto would cost a start more)
  const temp = `${file}.${process.pid}.${Math.random().toString(36).slice(2)}.tmp`
  try {
    fs.mkdirSync(path.dirname(file), {recursive: true, mode: 0o700})
    // a new file of our own (O_EXCL never follows a symlink planted at the name), renamed over the record
    const fd = fs.openSync(temp, fs.constants.O_WRONLY | fs.constants.O_CREAT | fs.constants.O_EXCL | fs.constants.O_NOFOLLOW, 0o600)
    try {
      fs.writeSync(fd, `${JSON.stringify({key, at: Date.now(), answer})}\n`)
    } finally {
      fs.closeSync(fd)
    }
    fs.renameSync(temp, file)
  } catch {
    fs.rmSync(temp, {force: true})
    // a read-only home: the next start probes again
  }
}

/** Forgets a record that turned out wrong (the next start probes again). */
export function forget(file: string): void {
  fs.rmSync(file, {force: true})
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
