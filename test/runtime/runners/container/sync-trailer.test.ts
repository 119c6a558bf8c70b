import os from 'node:os'
import path from 'node:path'
import {PassThrough} from 'node:stream'
import {describe, expect, it} from 'vitest'
import {SYNC_TRAILER} from '../../../../src/runtime/agent-run/workspace-changes.js'
import {splitSyncTrailer} from '../../../../src/runtime/runners/container/sync-trailer.js'
import type {ByteSource} from '../../../../src/runtime/util/spooled-bytes.js'
import {readTar, writeTar} from '../../../../src/runtime/util/tar.js'

/*
 * A sync engine's run container sends agent-run's frames, then the run's changes, on one stdout.
 * The frames must reach the LLM channel whole and alone however the stream is cut; the trailer is
 * taken once its tar has arrived whole (up to its two zero blocks), within the bound, before
 * stdout ends.
 */

async function split(chunks: Array<string | Buffer>, maxBytes = 1024, endAtOnce = false) {
  const stdout = new PassThrough()
  const {frames, trailer, overLimit, spoolFailure} = splitSyncTrailer(stdout, maxBytes, SPOOL)
  const seen: Buffer[] = []
  frames.on('data', (chunk: Buffer) => seen.push(chunk))
  const ended = new Promise((resolve) => frames.once('end', resolve))
  for (const chunk of chunks) {
    stdout.write(chunk)
    // at once: the end comes while the spool's writes are still queued
    if (!endAtOnce) await new Promise((resolve) => setImmediate(resolve))
  }
  stdout.end()
  const taken = await trailer
  await ended
  // the runner reads spoolFailure a while after: the writes that were on their way have settled
  if (endAtOnce) await new Promise((resolve) => setTimeout(resolve, 200))
  return {frames: Buffer.concat(seen).toString(), trailer: taken, overLimit: overLimit(), spoolFailure: spoolFailure()}
}

const SPOOL = path.join(os.tmpdir(), 'meepa-test-sync-spool')
/** A trailer's part as latin1 text. */
const text = (source: ByteSource | undefined) => source?.read(0, source.length).toString('latin1')

const FRAMES = '{"type":"llm_request","id":1}\n{"type":"result","output":{}}\n'
/** A real tar of one file (header, data, then its two zero blocks), as latin1 text. */
const TAR = writeTar([{name: 'f', type: '0', mode: 0o644, mtimeMs: 0, data: Buffer.from('TARDATA')}]).toString('latin1')
/** A tar of one 12 MiB file, as latin1 text: cut anywhere before its end, it is cut short. */
const BIG_TAR = writeTar([{name: 'big', type: '0', mode: 0o644, mtimeMs: 0, data: Buffer.alloc(12 << 20)}]).toString(
  'latin1',
)
/** A PAX extended header (type x) holding `records`, padded to whole blocks. */
function pax(records: string): Buffer {
  const block = Buffer.alloc(512)
  block.write('././@PaxHeader', 0)
  block.write('0000644\0', 100)
  block.write(`${records.length.toString(8).padStart(11, '0')}\0`, 124)
  block.write('x', 156)
  block.write('ustar\x0000', 257)
  block.fill(' ', 148, 156)
  let sum = 0
  for (const byte of block) sum += byte
  block.write(`${sum.toString(8).padStart(6, '0')}\0 `, 148)
  return Buffer.concat([block, Buffer.from(records.padEnd(Math.max(512, Math.ceil(records.length / 512) * 512), '\0'))])
}
const trailerOf = (list: string, tar: string) => `${SYNC_TRAILER} ${list.length}\n${list}${tar}`

describe('a sync engine’s stdout: frames, then the run’s changes', () => {
  it('gives the frames to the channel and the list and tar to the host, in one chunk or byte by byte', async () => {
    const whole = FRAMES + trailerOf('a\0b\0', TAR)
    for (const chunks of [[whole], whole.split('')]) {
      const {frames, trailer} = await split(chunks, 4096)
      expect(frames).toBe(FRAMES)
      expect(text(trailer?.list)).toBe('a\0b\0')
      expect(text(trailer?.changes)).toBe(TAR)
    }
  })

  it('passes a frame that only starts like the header on to the channel', async () => {
    const lookalike = `${SYNC_TRAILER} 1 2\n${SYNC_TRAILER.slice(0, 5)}\n`
    const {frames, trailer} = await split([FRAMES, lookalike.slice(0, 7), lookalike.slice(7)])
    expect(frames).toBe(FRAMES + lookalike)
    expect(trailer).toBeUndefined()
  })

  it('takes nothing when the trailer is over the bound, cut short, or not a tar', async () => {
    const over = await split([FRAMES, trailerOf('a\0', 'x'.repeat(2 * 1024 * 1024) + TAR)], 1024)
    expect(over.trailer).toBeUndefined()
    expect(over.frames).toBe(FRAMES)
    // past the bound it says so (the run wrote past limits.disk: E_DISK); cut short, it does not
    expect(over.overLimit).toBeGreaterThan(1024 + 1024 * 1024)
    const cut = await split([FRAMES, trailerOf('a\0', TAR.slice(0, 1000))], 4096)
    expect(cut.trailer).toBeUndefined()
    expect(cut.overLimit).toBeUndefined()
    // cut short past what memory holds, its spool's writes still on their way: listed again, never "not held";
    // past the bound there too: over the limit, not a host that could not hold it
    const bigCut = [FRAMES, trailerOf('a\0', BIG_TAR.slice(0, 6 << 20)), BIG_TAR.slice(6 << 20, 8 << 20)]
    const spooled = await split(bigCut, 64 << 20, true)
    expect(spooled.trailer).toBeUndefined()
    expect(spooled.spoolFailure).toBeUndefined()
    const overSpooled = await split(bigCut, 4 << 20, true)
    expect(overSpooled.overLimit).toBeGreaterThan(5 << 20)
    expect(overSpooled.spoolFailure).toBeUndefined()
    expect((await split([FRAMES, trailerOf('a\0', 'NOT A TAR'.padEnd(1536, '.'))], 4096)).trailer).toBeUndefined()
  })

  it('refuses a tar whose PAX size is negative (it would walk back and loop), at once', async () => {
    const looping = Buffer.concat([pax('14 size=-1536\n'), pax('')]).toString('latin1')
    const started = Date.now()
    expect((await split([FRAMES, trailerOf('', looping)], 1 << 20)).trailer).toBeUndefined()
    expect(Date.now() - started).toBeLessThan(5000)
    expect(() => [...readTar(Buffer.from(looping + '\0'.repeat(1024), 'latin1'))]).toThrow(/PAX size/)
  })

  it('refuses a PAX header whose record lengths would walk it byte by byte, at once', async () => {
    // "1 " after 256 KiB of zeros: a length of 1 read over the zeros re-reads them at every byte
    const crawling = Buffer.concat([pax(`${'0'.repeat(256 * 1024)}1 \n`), Buffer.alloc(1024)]).toString('latin1')
    const started = Date.now()
    expect((await split([FRAMES, trailerOf('', crawling)], 1 << 20)).trailer).toBeUndefined()
    expect(() => [...readTar(Buffer.from(crawling, 'latin1'))]).toThrow(/damaged PAX header/)
    expect(Date.now() - started).toBeLessThan(2000)
  })

  it('takes the tar up to its end, before stdout ends, and nothing written after it', async () => {
    const stdout = new PassThrough()
    const {frames, trailer} = splitSyncTrailer(stdout, 4096, SPOOL)
    frames.resume()
    stdout.write(Buffer.from(FRAMES + trailerOf('a\0', TAR) + 'forged', 'latin1'))
    const taken = await trailer // stdout still open: the container has not exited yet
    expect(text(taken?.changes)).toBe(TAR)
    stdout.end()
  })

  it('ends the frames when stdout ends without a trailer (a run that failed)', async () => {
    const {frames, trailer} = await split([FRAMES, '{"type":"res'])
    expect(frames).toBe(`${FRAMES}{"type":"res`)
    expect(trailer).toBeUndefined()
  })

  it('gives up at once on a trailer whose name list claims more than 1 GiB, holding none of it', async () => {
    const stdout = new PassThrough()
    const {frames, trailer} = splitSyncTrailer(stdout, 4 * 2 ** 30, SPOOL)
    const seen: Buffer[] = []
    frames.on('data', (chunk: Buffer) => seen.push(chunk))
    stdout.write(`${FRAMES}${SYNC_TRAILER} ${2 ** 30 + 1}\n`)
    stdout.write('a\0b\0')
    // settled by the header itself, while the stream is still open (a bound's check, not its end)
    const settled = await Promise.race([trailer, new Promise((resolve) => setTimeout(() => resolve('open'), 500))])
    expect(settled).toBeUndefined()
    await new Promise((resolve) => setImmediate(resolve))
    expect(Buffer.concat(seen).toString()).toBe(FRAMES)
    stdout.end()
  })
})
