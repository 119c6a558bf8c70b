import fs from 'node:fs'
import path from 'node:path'
import {makeDirectories} from '../util/make-directories.js'
import {randomHex} from '../util/random.js'

const {O_RDONLY, O_WRONLY, O_CREAT, O_EXCL, O_NOFOLLOW, O_NONBLOCK} = fs.constants
/** Entry names the spool makes: anything else in its directory is not its own and is left alone. */
const ENTRY_NAME = /^[0-9a-f]{32}$/

/**
 * The gateway's own copies of the files replies carry (`<home>/spool/outbox`, mode 0700, out of
 * every agent's reach): written once when the run ends, so what is delivered later, after
 * reconnects or a restart, is what the run produced, whatever the agent does to its workspace
 * meanwhile. Entries are named at random, written whole and synced before the outbox row that
 * names them is committed; one the outbox no longer names is removed (sweep).
 */
export class OutboxSpool {
  constructor(readonly dir: string) {}

  /** Writes a new entry (never an existing name, never through a link); returns its name. */
  put(data: Buffer): string {
    makeDirectories(this.dir, 0o700)
    const name = randomHex(16)
    const file = path.join(this.dir, name)
    const fd = fs.openSync(file, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW, 0o600)
    try {
      fs.writeFileSync(fd, data)
      fs.fsyncSync(fd)
    } catch (error) {
      fs.rmSync(file, {force: true})
      throw error
    } finally {
      fs.closeSync(fd)
    }
    return name
  }

  /** An entry's bytes, which must be exactly `size`; a reason when it is gone or not what was written. */
  read(name: string, size: number): {data: Buffer} | {problem: string} {
    if (!ENTRY_NAME.test(name)) return {problem: 'its spooled copy has a name the spool never makes'}
    let fd: number
    try {
      fd = fs.openSync(path.join(this.dir, name), O_RDONLY | O_NOFOLLOW | O_NONBLOCK)
    } catch (error) {
      return {problem: `its spooled copy cannot be opened (${(error as NodeJS.ErrnoException).code ?? error})`}
    }
    try {
      const stat = fs.fstatSync(fd)
      if (!stat.isFile() || stat.size !== size)
        return {problem: `its spooled copy is not the ${size} bytes the run produced`}
      const data = Buffer.alloc(size)
      let length = 0
      while (length < size) {
        const read = fs.readSync(fd, data, length, size - length, null)
        if (read === 0) return {problem: 'its spooled copy is shorter than it was'}
        length += read
      }
      return {data}
    } finally {
      fs.closeSync(fd)
    }
  }

  remove(name: string): void {
    if (ENTRY_NAME.test(name)) fs.rmSync(path.join(this.dir, name), {force: true})
  }

  /** Removes every entry not in `owed` (a crash between a write and its commit, a part no longer owed). */
  sweep(owed: ReadonlySet<string>): number {
    let names: string[]
    try {
      names = fs.readdirSync(this.dir)
    } catch {
      return 0 // no spool yet
    }
    let removed = 0
    for (const name of names)
      if (ENTRY_NAME.test(name) && !owed.has(name)) {
        this.remove(name)
        removed++
      }
    return removed
  }
}
