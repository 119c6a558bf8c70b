import type Database from 'better-sqlite3'
import fs from 'node:fs'
import path from 'node:path'
import {setTimeout as sleep} from 'node:timers/promises'
import {GatewayError} from '../util/errors.js'
import {makeHomeDirectories} from '../util/make-directories.js'
import {processAlive} from '../util/process-alive.js'
import {readRegularFile} from '../util/regular-file.js'
import {openSqlite} from '../util/sqlite.js'
import {writeWholeFile} from '../util/write-whole-file.js'

/** How long a loser waits for the winner's pid file: the winner writes it right after locking. */
const PID_WAIT_MS = 2000
const PID_POLL_MS = 20

export interface HomeLock {
  readonly file: string
  /** Removes the pid file, then drops the lock (the kernel drops it anyway when the process ends). */
  release(): void
}

/**
 * One gateway per home: an exclusive lock on `MEEPAGATEWAY_HOME/serve.lock`, held until release()
 * or the process's end. The lock is SQLite's (a POSIX fcntl record lock, in EXCLUSIVE locking
 * mode): Node has no flock, SQLite is already loaded for gateway.db, and the kernel drops the
 * lock when the process dies however it dies. The pid file only names the holder for the error.
 */
export async function lockGatewayHome(home: string): Promise<HomeLock> {
  makeHomeDirectories(home, home)
  const file = path.join(home, 'serve.lock')
  const pidFile = path.join(home, 'serve.pid')
  const deadline = Date.now() + PID_WAIT_MS
  for (;;) {
    const db = tryLock(file)
    if (db) {
      writeWholeFile(pidFile, `${process.pid}\n`, {mode: 0o600})
      return {
        file,
        release: () => {
          fs.rmSync(pidFile, {force: true})
          db.close()
        },
      }
    }
    // the holder's pid file can lag its lock by a write, or name a gateway that died (its lock is free again: retried)
    const holder = readPid(pidFile)
    if (holder !== undefined || Date.now() > deadline) throw gatewayRunning(home, holder)
    // two started at the same instant can each hold SQLite's shared lock as the other asks for its
    // exclusive one: both busy, in step, every try until both gave up (seen in CI). A random wait breaks the step.
    await sleep(PID_POLL_MS / 2 + Math.random() * PID_POLL_MS * 1.5)
  }
}

/** The lock's connection, or undefined while another connection (any process, this one too) holds it. */
function tryLock(file: string): Database.Database | undefined {
  refuseNonRegularFile(file)
  const db = openSqlite(file, {timeout: 0})
  try {
    // a write in EXCLUSIVE locking mode keeps SQLite's exclusive lock until the connection closes
    db.pragma('locking_mode = EXCLUSIVE')
    db.pragma('journal_mode = MEMORY')
    db.exec('BEGIN EXCLUSIVE; COMMIT')
    return db
  } catch (error) {
    db.close()
    if ((error as {code?: string}).code === 'SQLITE_BUSY') return undefined
    throw new GatewayError(
      'E_STATE',
      `the gateway home's lock file ${file} cannot be used: ${(error as Error).message}`,
      {
        cause: error,
        suggestions: [`remove ${file} (it holds nothing) while no \`meepagateway serve\` runs, then start serve again`],
      },
    )
  }
}

/**
 * SQLite opens the file O_NOFOLLOW, but only after resolving a symlink at its path itself: a
 * symlink (or anything but a plain file) planted there is refused before SQLite sees the path.
 */
function refuseNonRegularFile(file: string): void {
  const stat = fs.lstatSync(file, {throwIfNoEntry: false})
  if (!stat || stat.isFile()) return
  throw new GatewayError(
    'E_STATE',
    `the gateway home's lock file ${file} is not a regular file (${stat.isSymbolicLink() ? 'a symlink' : 'a directory or special file'})`,
    {
      suggestions: [`remove ${file} (serve makes it again), then start serve again`],
    },
  )
}

/** The pid the pid file names, when that process is alive (a symlink or a FIFO there names none). */
function readPid(pidFile: string): number | undefined {
  let text: string
  try {
    text = readRegularFile(pidFile)?.toString('utf8') ?? ''
  } catch {
    return undefined
  }
  const pid = Number(text.trim())
  return Number.isInteger(pid) && pid > 0 && processAlive(pid) ? pid : undefined
}

function gatewayRunning(home: string, pid: number | undefined): GatewayError {
  const who = pid === undefined ? 'another gateway (its pid is not recorded)' : `another gateway (pid ${pid})`
  return new GatewayError(
    'E_GATEWAY_RUNNING',
    `${who} is already serving ${home}; this one exits and changes nothing`,
    {
      details: pid === undefined ? {} : {pid},
      suggestions: [
        pid === undefined
          ? 'stop the running `meepagateway serve` first'
          : `stop it first (kill ${pid}), or use that gateway: \`meepagateway send\` hands messages to it`,
        'to run a second gateway, give it a home of its own: MEEPAGATEWAY_HOME=/another/dir meepagateway serve',
      ],
    },
  )
}
