import fs from 'node:fs'
import path from 'node:path'

/**
 * An answer remembered across processes, in a file of MEEPAGATEWAY_HOME/cache (which no agent can
 * reach), under a key naming everything the answer depends on: a CLI start then skips work an
 * earlier start did (a host probe, parsing the config). Only a file of this user's, written by no
 * one else, counts.
 */

/** Larger than any record: a file past it is not one, and an answer past it is not remembered. */
const MAX_RECORD_BYTES = 64 * 1024

export interface RecallOptions {
  /** How long the answer holds (a probe's answer can go out of date); a pure function's never does. */
  maxAgeMs: number
}

export function recalled<T>(file: string, key: string, options: RecallOptions): T | undefined {
  try {
    const record = JSON.parse(readRecord(file)) as {key?: unknown; at?: unknown; answer?: T}
    if (record.key === key && typeof record.at === 'number' && Math.abs(Date.now() - record.at) < options.maxAgeMs)
      return record.answer
  } catch {
    // none yet, damaged, unreadable, not a regular file or not ours alone: work it out again
  }
  return undefined
}

/**
 * The record's text: never through a symlink, never blocking on a FIFO or a device, never
 * unbounded, never another's.
 */
function readRecord(file: string): string {
  const fd = fs.openSync(file, fs.constants.O_RDONLY | fs.constants.O_NOFOLLOW | fs.constants.O_NONBLOCK)
  try {
    const stat = fs.fstatSync(fd)
    if (!stat.isFile() || stat.size > MAX_RECORD_BYTES) throw new Error(`${file} is not a record`)
    if (stat.uid !== process.getuid?.() || (stat.mode & 0o022) !== 0)
      throw new Error(`${file} is writable by another user`)
    const buffer = Buffer.alloc(stat.size)
    return buffer.subarray(0, fs.readSync(fd, buffer, 0, stat.size, 0)).toString('utf8')
  } finally {
    fs.closeSync(fd)
  }
}

export function remember(file: string, key: string, answer: unknown): void {
  const text = `${JSON.stringify({key, at: Date.now(), answer})}\n`
  if (Buffer.byteLength(text) > MAX_RECORD_BYTES) return // never read back
  // unguessable enough, and O_EXCL refuses a name that exists (node:crypto would cost a start more)
  const temp = `${file}.${process.pid}.${Math.random().toString(36).slice(2)}.tmp`
  try {
    // the cache directory, never the home (a command given --config does not create one)
    if (!fs.existsSync(path.dirname(file))) fs.mkdirSync(path.dirname(file), {mode: 0o700})
    // a new file of our own (O_EXCL never follows a symlink planted at the name), renamed over the record
    const fd = fs.openSync(
      temp,
      fs.constants.O_WRONLY | fs.constants.O_CREAT | fs.constants.O_EXCL | fs.constants.O_NOFOLLOW,
      0o600,
    )
    try {
      fs.writeSync(fd, text)
    } finally {
      fs.closeSync(fd)
    }
    fs.renameSync(temp, file)
  } catch {
    fs.rmSync(temp, {force: true})
    // a read-only home: the next start works it out again
  }
}

/** Forgets a record that turned out wrong (the next start works it out again). */
export function forget(file: string): void {
  fs.rmSync(file, {force: true})
}
