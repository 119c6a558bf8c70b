import {PassThrough} from 'node:stream'
import {describe, expect, it} from 'vitest'
import {splitSyncTrailer, SYNC_TRAILER} from '../../../../src/runtime/runners/container/sync-trailer.js'

/*
 * A sync engine's run container sends agent-run's frames, then the run's changes, on one stdout.
 * The frames must reach the LLM channel whole and alone however the stream is cut; the trailer is
 * taken only when it is exactly what its header announced and within the bound.
 */

async function split(chunks: Array<string | Buffer>, maxBytes = 1024) {
  const stdout = new PassThrough()
  const {frames, trailer} = splitSyncTrailer(stdout, maxBytes)
  const seen: Buffer[] = []
  frames.on('data', (chunk: Buffer) => seen.push(chunk))
  const ended = new Promise((resolve) => frames.once('end', resolve))
  for (const chunk of chunks) {
    stdout.write(chunk)
    await new Promise((resolve) => setImmediate(resolve))
  }
  stdout.end()
  const taken = await trailer
  await ended
  return {frames: Buffer.concat(seen).toString(), trailer: taken}
}

const FRAMES = '{"type":"llm_request","id":1}\n{"type":"result","output":{}}\n'
const trailerOf = (list: string, tar: string) => `${SYNC_TRAILER} ${list.length} ${tar.length}\n${list}${tar}`

describe('a sync engine’s stdout: frames, then the run’s changes', () => {
  it('gives the frames to the channel and the list and tar to the host, in one chunk or byte by byte', async () => {
    const whole = FRAMES + trailerOf('a\0b\0', 'TARDATA')
    for (const chunks of [[whole], whole.split('')]) {
      const {frames, trailer} = await split(chunks)
      expect(frames).toBe(FRAMES)
      expect(trailer?.list.toString()).toBe('a\0b\0')
      expect(trailer?.changes.toString()).toBe('TARDATA')
    }
  })

  it('passes a frame that only starts like the header on to the channel', async () => {
    const lookalike = `${SYNC_TRAILER} 1 2 3\n${SYNC_TRAILER.slice(0, 5)}\n`
    const {frames, trailer} = await split([FRAMES, lookalike.slice(0, 7), lookalike.slice(7)])
    expect(frames).toBe(FRAMES + lookalike)
    expect(trailer).toBeUndefined()
  })

  it('takes nothing when the trailer is over the bound, short, or followed by more than it announced', async () => {
    const over = await split([FRAMES, `${SYNC_TRAILER} 10 ${2 * 1024 * 1024}\n0123456789`], 1024)
    expect(over.trailer).toBeUndefined()
    expect(over.frames).toBe(FRAMES)
    expect((await split([FRAMES, `${SYNC_TRAILER} 4 10\nab`])).trailer).toBeUndefined()
    expect((await split([FRAMES, `${trailerOf('a\0', 'T')}forged`])).trailer).toBeUndefined()
  })

  it('ends the frames when stdout ends without a trailer (a run that failed)', async () => {
    const {frames, trailer} = await split([FRAMES, '{"type":"res'])
    expect(frames).toBe(`${FRAMES}{"type":"res`)
    expect(trailer).toBeUndefined()
  })
})
