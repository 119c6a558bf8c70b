import {PassThrough, type Readable} from 'node:stream'

/**
 * On a sync engine the run's container, once agent-run has ended, writes what the run changed on
 * its stdout after agent-run's last frame (workspace-sync.ts, syncingCommand): a line
 * `SYNC_TRAILER <list bytes> <tar bytes>`, then the name list and the change tar. It comes over the
 * connection the run already has, before the container has even exited: no `docker cp`, no wait
 * for the engine's teardown. Anything in the container could write there too; what it sends is
 * handled exactly as the files `docker cp` would bring (hostile, bounded), so it gains nothing.
 */
export const SYNC_TRAILER = 'MEEPA-SYNC-TRAILER'

export interface SyncTrailer {
  list: Buffer
  changes: Buffer
}

export interface SplitStdout {
  /** agent-run's frames: everything before the trailer line (for the LLM channel). */
  frames: Readable
  /**
   * The trailer once whole; undefined when stdout ended without one, or it was malformed or over
   * `maxBytes` (the host then takes the files with `docker cp`, which bounds them again).
   */
  trailer: Promise<SyncTrailer | undefined>
}

const HEADER = new RegExp(`^${SYNC_TRAILER} (\\d{1,15}) (\\d{1,15})$`)
/** Longest line looked at for the trailer's header: frames may be long, the header is not. */
const MAX_HEADER_BYTES = 64

export function splitSyncTrailer(stdout: Readable, maxBytes: number): SplitStdout {
  const frames = new PassThrough()
  let settle: (trailer: SyncTrailer | undefined) => void = () => {}
  const trailer = new Promise<SyncTrailer | undefined>((resolve) => (settle = resolve))
  /** The end of the stream after its last newline, held back while it could be the header's start. */
  let pending = Buffer.alloc(0)
  let body: {listBytes: number; tarBytes: number; chunks: Buffer[]; size: number} | undefined
  let done = false
  const finish = (value: SyncTrailer | undefined) => {
    if (done) return
    done = true
    if (!body && pending.length > 0) frames.write(pending)
    frames.end()
    stdout.removeListener('data', onData)
    settle(value)
  }
  const takeBody = (chunk: Buffer) => {
    body!.chunks.push(chunk)
    body!.size += chunk.length
    const {listBytes, tarBytes, size} = body!
    if (size < listBytes + tarBytes) return
    // anything after the announced bytes is not the wrapper's: take nothing from this trailer
    if (size > listBytes + tarBytes) return finish(undefined)
    const whole = Buffer.concat(body!.chunks)
    finish({list: whole.subarray(0, listBytes), changes: whole.subarray(listBytes)})
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
        if (start > 0) frames.write(data.subarray(0, start))
        const [listBytes, tarBytes] = [Number(header[1]), Number(header[2])]
        if (listBytes + tarBytes > maxBytes + 1024 * 1024) return finish(undefined)
        body = {listBytes, tarBytes, chunks: [], size: 0}
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
  stdout.once('end', () => finish(undefined))
  stdout.once('close', () => finish(undefined))
  stdout.once('error', () => finish(undefined))
  return {frames, trailer}
}

function couldBeHeader(tail: Buffer): boolean {
  if (tail.length === 0 || tail.length > MAX_HEADER_BYTES) return false
  const text = tail.toString('latin1')
  return SYNC_TRAILER.startsWith(text) || text.startsWith(`${SYNC_TRAILER} `)
}
