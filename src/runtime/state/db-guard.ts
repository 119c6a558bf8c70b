import fs from 'node:fs'
import {gatewayDbPath} from '../util/paths.js'
import {openGatewayDb, shareGatewayDb, type GatewayDb} from './gateway-db.js'

/** How often the file at gateway.db's path is compared with the one the gateway has open. */
const IDENTITY_CHECK_MS = 1_000

/**
 * The serving gateway's connection to gateway.db, kept on the file at its path. SQLite goes on
 * writing to a deleted or replaced file through its open descriptor, and everything written
 * there (run records, API keys, the dashboard password) would be gone at the next start. So the
 * file's identity (device, inode) and header are checked every second (and whenever a write fails
 * as if damaged); when they changed, the open database is copied out first (SQLite still reads it
 * through its descriptor and cache), then: deleted → the copy is put back; replaced by a usable
 * database → the gateway switches to it (the copy is kept next to it); replaced by a damaged file,
 * or damaged in place → that file is moved aside as gateway.db.corrupt-<time> and the copy put
 * back. Every part of the gateway holds `db`, which follows the switch.
 */
export class GuardedGatewayDb {
  readonly db: GatewayDb
  readonly file: string
  /** Set while the database cannot be used (shown by /healthz); undefined when all is well. */
  problem: string | undefined
  private current: GatewayDb | undefined
  private identity: {dev: number; ino: number}
  private readonly timer: NodeJS.Timeout
  private damaged = false

  constructor(
    private readonly home: string,
    private readonly log: (line: string) => void,
  ) {
    this.file = gatewayDbPath(home)
    const opened = openGatewayDb(home, {check: true})
    this.current = opened
    this.identity = identityOf(this.file) ?? {dev: -1, ino: -1}
    this.db = new Proxy(opened, {
      get: (_target, property) => {
        const db = this.current ?? opened // a closed connection throws "not open": the write fails and is logged
        const value = Reflect.get(db, property, db) as unknown
        return typeof value === 'function' ? (value as (...args: unknown[]) => unknown).bind(db) : value
      },
    })
    this.timer = setInterval(() => this.check(), IDENTITY_CHECK_MS).unref()
    shareGatewayDb(home, this.db)
  }

  /** A write failed as if the file were damaged: checked (and repaired) now rather than at the next tick. */
  suspect(): void {
    this.damaged = true
    this.check()
  }

  /** Compares the file at the path with the open one and repairs a difference (see the class comment). */
  check(): void {
    const now = identityOf(this.file)
    const same = Boolean(this.current && now && now.dev === this.identity.dev && now.ino === this.identity.ino)
    if (same && !this.damaged && hasSqliteHeader(this.file)) return
    const change = !now ? 'deleted' : same ? 'damaged' : 'replaced'
    this.damaged = false
    const stamp = new Date().toISOString().replace(/[:.]/g, '-')
    try {
      if (this.current) {
        const snapshot = `${this.file}.snapshot-${stamp}`
        this.current.pragma('wal_checkpoint(TRUNCATE)')
        this.current.prepare('VACUUM INTO ?').run(snapshot)
        this.current.close()
        this.current = undefined
        this.log(
          `gateway: ${this.file} was ${change} while the gateway was running; copied the open database to ${snapshot}`,
        )
        if (change === 'deleted') {
          fs.renameSync(snapshot, this.file)
          this.log(`gateway: restored ${this.file} from the open database; nothing written before was lost`)
        } else {
          try {
            if (change === 'damaged') throw new Error('its header is not an SQLite header')
            openGatewayDb(this.home, {check: true}).close()
            this.log(`gateway: now using the new ${this.file}; what the gateway had before is kept in ${snapshot}`)
          } catch (error) {
            const aside = `${this.file}.corrupt-${stamp}`
            fs.renameSync(this.file, aside)
            fs.renameSync(snapshot, this.file)
            this.log(
              `gateway: the ${change === 'damaged' ? 'damaged' : 'new'} ${this.file} is not usable (${(error as Error).message.split('\n')[0]}); moved it to ${aside} and restored the open database`,
            )
          }
        }
      }
      this.current = openGatewayDb(this.home, {check: true})
      this.identity = identityOf(this.file) ?? this.identity
      if (this.problem) this.log(`gateway: ${this.file} is usable again`)
      this.problem = undefined
    } catch (error) {
      const problem = `gateway.db cannot be used: ${(error as Error).message.split('\n')[0]}`
      if (problem !== this.problem)
        this.log(`gateway: ${problem}; run records are not kept until it is fixed (retrying every second)`)
      this.problem = problem
    }
  }

  close(): void {
    clearInterval(this.timer)
    shareGatewayDb(this.home, undefined)
    this.current?.close()
    this.current = undefined
  }
}

const SQLITE_MAGIC = Buffer.from('SQLite format 3\0')

/**
 * Cheap damage check every tick: the first 16 bytes of every SQLite database (a deeper one is
 * quick_check at start).
 */
function hasSqliteHeader(file: string): boolean {
  try {
    const fd = fs.openSync(file, 'r')
    try {
      const head = Buffer.alloc(SQLITE_MAGIC.length)
      // empty until the first checkpoint: in WAL mode the first pages live in gateway.db-wal
      return fs.readSync(fd, head, 0, head.length, 0) === 0 || head.equals(SQLITE_MAGIC)
    } finally {
      fs.closeSync(fd)
    }
  } catch {
    return false
  }
}

function identityOf(file: string): {dev: number; ino: number} | undefined {
  try {
    const stat = fs.statSync(file)
    return {dev: stat.dev, ino: stat.ino}
  } catch {
    return undefined
  }
}
