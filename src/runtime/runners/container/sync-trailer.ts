import {PassThrough, type Readable} from 'node:stream'
import {SYNC_TRAILER, TRAILER_SLACK_BYTES} from '../../agent-run/workspace-changes.js'
import {SpooledBytes, type ByteSource} from '../../util/spooled-bytes.js'
import {TarEnd} from '../../util/tar.js'

/**
 * On a sync engine agent-run writes what the run changed on its stdout after its last frame
 * (agent-run/workspace-changes.ts), as a helper listing them again does (workspace-sync.ts): a line
 * `SYNC_TRAILER <list bytes>`, the name list, then the change tar, streamed: it is whole when its
 * two zero blocks have come, which the host sees as they come (no length up front, no wait for the
 * end of stdout, which comes only with the container's teardown). Nothing of it is written in the
 * agent's volume first (a volume at its limits.disk would have no room for it). It comes over the
 * connection the run already has: no `docker cp`. What arrives is handled exactly as a helper's
 * listing would be (hostile, bounded). A command of the agent cannot open agent-run's stdout to
 * forge it while the sandbox helper runs it (Landlock refuses /proc/PID/fd of agent-run).
 */
export interface SyncTrailer {
  /** The names the volume holds, NUL-separated. */
  list: ByteSource
  /** The change tar. */
  changes: ByteSource
  /** Frees what holds them (past SPOOL_AFTER_BYTES, a file of the spool); idempotent. */
  close(): void
}

export interface SplitStdout {
  /** agent-run's frames: everything before the trailer line (for the LLM channel). */
  frames: Readable
  /**
   * The trailer once its tar is whole; undefined when stdout ended without one, or the trailer
   * was malformed, cut short or over `maxBytes` (the host then lists the changes again from the
   * volume, workspace-sync.ts), or the host could not hold it (`spoolFailure`).
   */
  trailer: Promise<SyncTrailer | undefined>
  /** Why the host could not hold a trailer that came (its disk full), once `trailer` settled. */
  spoolFailure(): Error | undefined
  /** The bytes it had taken when it went past `maxBytes` (the run wrote past limits.disk); else undefined. */
  overLimit(): number | undefined
}

/**
 * What a trailer may hold in the gateway's memory: past it the rest goes to an unlinked file of
 * the spool, so a run's changes (up to its limits.disk) never sit in memory whole.
 */
const SPOOL_AFTER_BYTES = 4 << 20
/** Pieces written to the spool ahead of the disk, past which stdout is paused (the engine waits). */
const PIECES_AHEAD = 16

const HEADER = new RegExp(`^${SYNC_TRAILER} (\\d{1,15})$`)
/**
 * The longest name list taken (what the volume holds, NUL-separated), past which no trailer is
 * held: far beyond any workspace (it is read in turns, never as one string), well within a Buffer's.
 */
const MAX_LIST_BYTES = 1 << 30
/** Longest line looked at for the trailer's header: frames may be long, the header is not. */
const MAX_HEADER_BYTES = 64

export function splitSyncTrailer(stdout: Readable, maxBytes: number, spoolDir: string): SplitStdout {
  const frames = new PassThrough()
  let settle: (trailer: SyncTrailer | undefined) => void = () => {}
  const trailer = new Promise<SyncTrailer | undefined>((resolve) => (settle = resolve))
  let spoolFailure: Error | undefined
  let overLimit: number | undefined
  /** The end of the stream after its last newline, held back while it could be the header's start. */
  let pending = Buffer.alloc(0)
  let body: {listBytes: number; tar: TarEnd; spool: SpooledBytes; size: number; ahead: number} | undefined
  let done = false
  const finish = (whole: boolean) => {
    if (done) return
    done = true
    if (!body && pending.length > 0) frames.write(pending)
    frames.end()
    stdout.removeListener('data', onData)
    // what follows is not taken, but must not hold the engine's stream
    stdout.resume()
    if (!body) return settle(undefined)
    const {spool, listBytes, tar} = body
    if (!whole) {
      spool.close()
      return settle(undefined)
    }
    spool.whenHeld().then(
      () => {
        const bytes = spool.source()
        settle({
          list: bytes.slice(0, listBytes),
          changes: bytes.slice(listBytes, tar.end!),
          close: () => spool.close(),
        })
      },
      (error: unknown) => {
        spoolFailure = error as Error
        spool.close()
        settle(undefined)
      },
    )
  }
  const hold = (taking: NonNullable<typeof body>, piece: Buffer) => {
    const writing = piece.length > 0 ? taking.spool.append(piece) : undefined
    if (!writing) return // held in memory already
    taking.ahead++
    if (taking.ahead > PIECES_AHEAD) stdout.pause()
    writing.then(
      () => {
        taking.ahead--
        if (!done && taking.ahead <= PIECES_AHEAD / 4) stdout.resume()
      },
      (error: unknown) => {
        // a spool this closed itself (a trailer cut short) fails the writes still on their way: no failure of the host's
        if (done) return
        spoolFailure ??= error as Error
        finish(false)
      },
    )
  }
  const takeBody = (chunk: Buffer) => {
    const taking = body!
    const before = taking.size
    taking.size += chunk.length
    if (taking.size > maxBytes + TRAILER_SLACK_BYTES) {
      overLimit = taking.size
      return finish(false)
    }
    const toList = Math.max(0, Math.min(chunk.length, taking.listBytes - before))
    if (toList === chunk.length) return hold(taking, chunk)
    const tarFed = before + toList - taking.listBytes
    try {
      taking.tar.feed(chunk.subarray(toList))
    } catch {
      return finish(false)
    }
    if (taking.tar.end === undefined) return hold(taking, chunk)
    // what follows the tar's end (tar's record padding) is not taken
    hold(taking, chunk.subarray(0, toList + taking.tar.end - tarFed))
    finish(true)
  }
  const onData = (chunk: Buffer) => {
    if (body) return takeBody(chunk)
    const data = pending.length > 0 ? Buffer.concat([pending, chunk]) : chunk
    pending = Buffer.alloc(0)
    let start = 0
    for (let newline = data.indexOf(10); newline !== -1; newline = data.indexOf(10, start)) {
      const header =
        newline - start <= MAX_HEADER_BYTES ? HEADER.exec(data.subarray(start, newline).toString('latin1')) : null
      if (header) {
        const listBytes = Number(header[1])
        if (start > 0) frames.write(data.subarray(0, start))
        if (listBytes > MAX_LIST_BYTES) return finish(false)
        const spool = new SpooledBytes(spoolDir, SPOOL_AFTER_BYTES)
        body = {listBytes, tar: new TarEnd(), spool, size: 0, ahead: 0}
        return takeBody(data.subarray(newline + 1))
      }
      start = newline + 1
    }
    const tail = data.subarray(start)
    if (couldBeHeader(tail)) {
      pending = Buffer.from(tail)
      if (start > 0) frames.write(data.subarray(0, start))
    } else frames.write(data)
  }
  stdout.on('data', onData)
  stdout.once('end', () => finish(false))
  stdout.once('close', () => finish(false))
  stdout.once('error', () => finish(false))
  return {frames, trailer, spoolFailure: () => spoolFailure, overLimit: () => overLimit}
}

function couldBeHeader(tail: Buffer): boolean {
  if (tail.length === 0 || tail.length > MAX_HEADER_BYTES) return false
  const text = tail.toString('latin1')
  return SYNC_TRAILER.startsWith(text) || text.startsWith(`${SYNC_TRAILER} `)
}
