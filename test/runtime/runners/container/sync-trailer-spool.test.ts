import {execFileSync} from 'node:child_process'
import {createHash, randomFillSync} from 'node:crypto'
import fs from 'node:fs'
import os from 'node:os'
import path from 'node:path'
import {PassThrough} from 'node:stream'
import v8 from 'node:v8'
import vm from 'node:vm'
import {afterEach, describe, expect, it, vi} from 'vitest'
import {SYNC_TRAILER} from '../../../../src/runtime/agent-run/workspace-changes.js'
import {splitSyncTrailer, type SyncTrailer} from '../../../../src/runtime/runners/container/sync-trailer.js'
import {
  pullWorkspace,
  snapshotWorkspace,
  type Snapshot,
} from '../../../../src/runtime/runners/container/workspace-sync.js'
import {writeTar} from '../../../../src/runtime/util/tar.js'
import {watchLoopGaps} from '../../../helpers/loop-gaps.js'

/*
 * A run on a sync engine sends its changes (up to its limits.disk) on stdout after its result. A
 * hostile run makes them as large as it may: the gateway must not hold them in its memory (one
 * such run per agent at once would end it), must leave nothing on the host's disk, and must say
 * so plainly when the host cannot hold them.
 */

const FRAMES = '{"type":"llm_request","id":1}\n{"type":"result","output":{}}\n'
const cleanups: Array<() => void> = []
afterEach(() => {
  for (const cleanup of cleanups.splice(0).reverse()) cleanup()
})

function tempDir(prefix: string): string {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), prefix))
  cleanups.push(() => fs.rmSync(dir, {recursive: true, force: true}))
  return dir
}

/** Writes `bytes` in pieces of 64 KiB, as an engine's stream arrives, waiting whenever the reader does. */
async function send(stdout: PassThrough, bytes: Buffer, onPiece: () => void = () => {}): Promise<void> {
  for (let at = 0; at < bytes.length; at += 64 * 1024) {
    if (!stdout.write(bytes.subarray(at, at + 64 * 1024))) await new Promise((resolve) => stdout.once('drain', resolve))
    onPiece()
  }
}

/** The descriptors of this process open on a file of `dir` (unlinked ones included). */
function openIn(dir: string): string[] {
  const open: string[] = []
  for (const fd of fs.readdirSync('/proc/self/fd')) {
    try {
      const target = fs.readlinkSync(`/proc/self/fd/${fd}`)
      if (target.startsWith(`${dir}/`)) open.push(target)
    } catch {
      // closed meanwhile
    }
  }
  return open
}

/** pullWorkspace given the trailer as it arrived (no engine is asked). */
const takeBack = (trailer: SyncTrailer, workspace: string, spool: string, synced: Snapshot) =>
  pullWorkspace(
    undefined as never,
    {volume: 'unused', synced, file: path.join(spool, 'record'), spoolDir: spool},
    {
      runId: 'run_spool',
      pushed: false,
      workspace,
      maxBytes: 64 << 20,
      log: () => {},
      trailer,
      helper: {image: 'unused', uid: 1000, gid: 1000, labels: {}},
    },
  )

v8.setFlagsFromString('--expose-gc')
const collect = vm.runInNewContext('gc') as () => void
/** What this process's heap and buffers hold once garbage is collected. */
function retained(): number {
  collect()
  const usage = process.memoryUsage()
  return usage.heapUsed + usage.arrayBuffers
}

const sha = (bytes: Buffer) => createHash('sha256').update(bytes).digest('hex')

describe('a run’s changes past what the gateway holds in memory', () => {
  it('waits in an unlinked spool file, never in memory, and is taken back whole', async () => {
    const spool = tempDir('meepa-spool-')
    const workspace = tempDir('meepa-spool-ws-')
    // 48 MiB of a file the run made, its bytes all different
    const data = Buffer.alloc(48 << 20)
    randomFillSync(data)
    const list = Buffer.from('./big.bin\0./notes.md\0')
    const tar = writeTar([
      {name: './big.bin', type: '0', mode: 0o600, mtimeMs: Date.now(), data},
      {name: './notes.md', type: '0', mode: 0o644, mtimeMs: Date.now(), data: Buffer.from('notes')},
    ])
    const stream = Buffer.concat([Buffer.from(`${FRAMES}${SYNC_TRAILER} ${list.length}\n`), list, tar])

    const stdout = new PassThrough()
    const split = splitSyncTrailer(stdout, 64 << 20, spool)
    const frames: Buffer[] = []
    split.frames.on('data', (chunk: Buffer) => frames.push(chunk))
    const before = process.memoryUsage().arrayBuffers
    let most = 0
    await send(stdout, stream, () => (most = Math.max(most, process.memoryUsage().arrayBuffers - before)))
    const trailer = await split.trailer
    expect(trailer).toBeDefined()
    expect(Buffer.concat(frames).toString()).toBe(FRAMES)
    // what it held at once: the first 4 MiB and the pieces on their way to the disk, not 48 MiB
    expect(most).toBeLessThan(16 << 20)
    // the spool's file has no name: nothing is left if the gateway dies now
    expect(fs.readdirSync(spool)).toEqual([])
    expect(openIn(spool)).toHaveLength(1)
    expect(openIn(spool)[0]).toMatch(/ \(deleted\)$/)

    // written between the event loop's turns: other agents' replies and timers go on meanwhile
    const gaps = watchLoopGaps()
    const started = performance.now()
    const {received, settled} = await takeBack(trailer!, workspace, spool, {})
    await settled // its fsyncs, after the reply: on libuv's threads too
    const took = performance.now() - started
    const longestGap = gaps.stop()
    expect(received).toBe(2)
    // copied in pieces and fsynced off the loop: no stretch held it for most of the take-back
    // (written in one go, the longest gap was the whole take-back, 83 of 83 ms here)
    expect(longestGap).toBeLessThan(took / 2)
    expect(sha(fs.readFileSync(path.join(workspace, 'big.bin')))).toBe(sha(data))
    expect(fs.readFileSync(path.join(workspace, 'notes.md'), 'utf8')).toBe('notes')
    // taken back: its space is freed with its descriptor
    await new Promise((resolve) => setTimeout(resolve, 50))
    expect(openIn(spool)).toEqual([])
    stdout.end()
  }, 60_000)

  it('reads a list of several MiB in pieces, a name cut between them whole, a "name" past any path left', async () => {
    const spool = tempDir('meepa-spool-')
    const workspace = tempDir('meepa-spool-ws-')
    for (const name of ['kept.md', 'gone.md', 'after.md']) fs.writeFileSync(path.join(workspace, name), name)
    const synced = snapshotWorkspace(workspace)
    // `./kept.md` across the first 1 MiB piece's end; 70 KiB without a NUL (no path is that long)
    // swallows nothing after it; `gone.md` is not listed, so the run removed it
    const filler = './filler\0'.repeat(Math.floor(((1 << 20) - 3) / 9))
    const list = Buffer.from(
      `${filler}${'.'.repeat((1 << 20) - 3 - filler.length)}\0./kept.md\0${'x'.repeat(70 * 1024)}\0./after.md\0${'./more\0'.repeat(600_000)}`,
    )
    expect(list.indexOf('./kept.md')).toBeLessThan(1 << 20)
    expect(list.indexOf('./kept.md') + 9).toBeGreaterThan(1 << 20)
    const tar = writeTar([])
    const stdout = new PassThrough()
    const split = splitSyncTrailer(stdout, 64 << 20, spool)
    split.frames.resume()
    await send(stdout, Buffer.concat([Buffer.from(`${FRAMES}${SYNC_TRAILER} ${list.length}\n`), list, tar]))
    const trailer = await split.trailer
    expect(trailer?.list.length).toBe(list.length)
    await takeBack(trailer!, workspace, spool, synced)
    expect(fs.readdirSync(workspace).sort()).toEqual(['after.md', 'kept.md'])
    stdout.end()
  }, 60_000)

  it('holds a stream of one-byte pieces in one buffer, not an object each', async () => {
    const spool = tempDir('meepa-spool-')
    const list = Buffer.from('./n\0'.repeat(128 * 1024)) // 512 KiB of names, under the 4 MiB held in memory
    const stdout = new PassThrough()
    const split = splitSyncTrailer(stdout, 64 << 20, spool)
    split.frames.resume()
    stdout.emit('data', Buffer.from(`${FRAMES}${SYNC_TRAILER} ${list.length}\n`))
    const before = retained()
    // as a run pacing its writes makes the engine's stream arrive: a byte a read
    for (let at = 0; at < list.length; at++) stdout.emit('data', list.subarray(at, at + 1))
    const after = retained()
    stdout.emit('data', writeTar([]))
    const trailer = await split.trailer
    expect(trailer?.list.read(0, list.length).equals(list)).toBe(true)
    trailer?.close()
    // an object per byte held was ≈ 100 bytes of heap each (≈ 50 MiB here)
    expect(after - before).toBeLessThan(8 << 20)
  }, 60_000)

  it('keeps a file the host saved while a large change to it was being written (a SOUL.md saved in the dashboard)', async () => {
    const spool = tempDir('meepa-spool-')
    const workspace = tempDir('meepa-spool-ws-')
    const soul = path.join(workspace, 'SOUL.md')
    fs.writeFileSync(soul, 'before the run')
    const synced = snapshotWorkspace(workspace)
    // the run's SOUL.md, past what memory holds: written between the loop's turns
    const runs = Buffer.alloc(8 << 20, 'r')
    const list = Buffer.from('./SOUL.md\0')
    const tar = writeTar([{name: './SOUL.md', type: '0', mode: 0o644, mtimeMs: Date.now(), data: runs}])
    const stdout = new PassThrough()
    const split = splitSyncTrailer(stdout, 64 << 20, spool)
    split.frames.resume()
    await send(stdout, Buffer.concat([Buffer.from(`${FRAMES}${SYNC_TRAILER} ${list.length}\n`), list, tar]))
    const trailer = await split.trailer
    // the operator saves it while the run's copy is being written beside it
    const writeSync = fs.writeSync.bind(fs) as (...args: unknown[]) => number
    const saving = vi.spyOn(fs, 'writeSync').mockImplementation(((fd: number, ...rest: unknown[]) => {
      const runsCopy = Buffer.isBuffer(rest[0]) && rest[0].length > 1 << 19 && rest[0][0] === 'r'.charCodeAt(0)
      if (runsCopy && fs.readFileSync(soul, 'utf8') === 'before the run')
        fs.writeFileSync(soul, 'saved in the dashboard')
      return writeSync(fd, ...rest)
    }) as typeof fs.writeSync)
    try {
      const {received} = await takeBack(trailer!, workspace, spool, synced)
      expect(received).toBe(0)
    } finally {
      saving.mockRestore()
    }
    expect(fs.readFileSync(soul, 'utf8')).toBe('saved in the dashboard')
    expect(fs.readdirSync(workspace)).toEqual(['SOUL.md']) // no temporary left
    stdout.end()
  })

  it('refuses to read a spooled trailer once it is freed (its descriptor may be another file by then)', async () => {
    const spool = tempDir('meepa-spool-')
    const stdout = new PassThrough()
    const split = splitSyncTrailer(stdout, 64 << 20, spool)
    split.frames.resume()
    const data = Buffer.alloc(6 << 20, 1)
    const tar = writeTar([{name: './big.bin', type: '0', mode: 0o600, mtimeMs: 0, data}])
    await send(stdout, Buffer.concat([Buffer.from(`${SYNC_TRAILER} 0\n`), tar]))
    const trailer = (await split.trailer)!
    const changes = trailer.changes
    expect(changes.read(0, 512).length).toBe(512)
    trailer.close()
    const other = fs.openSync(path.join(spool, 'another'), 'w+')
    try {
      fs.writeSync(other, 'another file')
      expect(() => changes.read(0, 512)).toThrow(/freed/)
      expect(() => changes.content(512, 10)).toThrow(/freed/)
    } finally {
      fs.closeSync(other)
    }
    stdout.end()
  }, 60_000)

  const root = process.getuid?.() === 0
  it.runIf(root)(
    'on a full disk: not taken, the reason kept, the frames whole, no descriptor left',
    async () => {
      const spool = tempDir('meepa-spool-full-')
      execFileSync('mount', ['-t', 'tmpfs', '-o', 'size=1m', 'tmpfs', spool])
      cleanups.push(() => execFileSync('umount', ['-l', spool]))
      const data = Buffer.alloc(8 << 20, 7)
      const tar = writeTar([{name: './big.bin', type: '0', mode: 0o600, mtimeMs: Date.now(), data}])
      const stdout = new PassThrough()
      const split = splitSyncTrailer(stdout, 64 << 20, spool)
      const frames: Buffer[] = []
      split.frames.on('data', (chunk: Buffer) => frames.push(chunk))
      void send(stdout, Buffer.concat([Buffer.from(`${FRAMES}${SYNC_TRAILER} 0\n`), tar])).then(() => stdout.end())
      expect(await split.trailer).toBeUndefined()
      expect(Buffer.concat(frames).toString()).toBe(FRAMES)
      expect(split.spoolFailure()).toMatchObject({code: 'ENOSPC'})
      await new Promise((resolve) => setTimeout(resolve, 50))
      expect(openIn(spool)).toEqual([])
    },
    60_000,
  )
})
