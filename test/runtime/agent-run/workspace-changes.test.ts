import {execaSync} from 'execa'
import fs from 'node:fs'
import os from 'node:os'
import path from 'node:path'
import {PassThrough, Writable} from 'node:stream'
import {afterAll, beforeAll, describe, expect, it} from 'vitest'
import {
  LostVolume,
  markRunStart,
  namesBeforeGo,
  type NamesBeforeGo,
  type RunStart,
  sendWorkspaceChanges,
  syncGoLine,
  SYNC_DIR,
  SYNC_FILL,
  SYNC_TRAILER,
  warmWorkspaceSync,
} from '../../../src/runtime/agent-run/workspace-changes.js'
import {StdinReader} from '../../../src/runtime/agent-run/runner-channel.js'
import {splitSyncTrailer} from '../../../src/runtime/runners/container/sync-trailer.js'
import {readTar} from '../../../src/runtime/util/tar.js'

/*
 * agent-run's side of a sync engine's workspace (workspace-changes.ts), on a real filesystem: the
 * start it marks from the go line, and the trailer it sends after its result, read back by the
 * host's own reader. Also on an ext4 that stamps whole seconds (128-byte inodes), as a volume may.
 */
const LIMIT = 128 * 1024 * 1024
const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms))

/** The start as agent-run takes it: marked, then the names of the moment, after this turn of the event loop. */
/** The fill token of these tests' volumes (the push's, in a real one). */
const FILL = 'a'.repeat(32)
/** The sync's folder with a fill's token, as the push that filled the volume leaves it. */
function filled(workspace: string, fill = FILL): void {
  fs.mkdirSync(path.join(workspace, SYNC_DIR), {recursive: true})
  fs.writeFileSync(path.join(workspace, SYNC_DIR, SYNC_FILL), `${fill}\n`)
}

async function startRun(workspace: string, goLine: string, taken?: NamesBeforeGo): Promise<RunStart> {
  const start = markRunStart(workspace, goLine, taken)
  await new Promise((resolve) => setImmediate(resolve))
  return start
}

/** What agent-run sends after marking `since`, as the host reads it. */
async function changesOf(workspace: string, start: RunStart, maxBytes = 64 * 1024 * 1024) {
  const out = new PassThrough()
  const split = splitSyncTrailer(out, maxBytes, path.join(os.tmpdir(), 'meepa-test-sync-spool'))
  split.frames.resume()
  await sendWorkspaceChanges(workspace, start, out)
  out.end()
  const trailer = await split.trailer
  expect(trailer).toBeDefined()
  const list = trailer!.list.read(0, trailer!.list.length)
  const changes = trailer!.changes.read(0, trailer!.changes.length)
  trailer!.close()
  const names = list.toString('utf8').split('\0').filter(Boolean).sort()
  const entries = [...readTar(changes, maxBytes)]
  const files = entries.filter((entry) => entry.type === '0').map((entry) => entry.name.replace(/^\.\//, ''))
  return {names, entries, files: files.sort(), changes}
}

for (const coarse of [false, true])
  describe(`the workspace changes agent-run sends${coarse ? ', on a filesystem that stamps whole seconds' : ''}`, () => {
    let root: string
    let workspace: string
    let outside: string
    // what a push wrote a tick before the mark: a whole second on the coarse filesystem
    const tick = coarse ? 1100 : 30

    beforeAll(() => {
      root = fs.mkdtempSync(path.join(os.tmpdir(), 'meepa-ws-changes-'))
      workspace = path.join(root, 'workspace')
      outside = path.join(root, 'outside')
      fs.mkdirSync(workspace)
      fs.mkdirSync(outside)
      if (coarse) {
        const image = path.join(root, 'coarse.ext4')
        execaSync('truncate', ['-s', '64M', image])
        execaSync('mkfs.ext4', ['-q', '-F', '-I', '128', image])
        execaSync('mount', ['-o', 'loop', image, workspace])
      }
      // as the push that filled the volume left it
      filled(workspace)
    })
    afterAll(() => {
      if (coarse) execaSync('umount', [workspace], {reject: false})
      fs.rmSync(root, {recursive: true, force: true})
    })

    it('sends what the run wrote after its go line, not what the volume held before; every name is listed', async () => {
      fs.writeFileSync(path.join(workspace, 'before.txt'), 'old')
      await sleep(tick)
      const since = await startRun(workspace, syncGoLine('run_first', false, LIMIT, FILL))
      fs.mkdirSync(path.join(workspace, 'new', 'deeper'), {recursive: true})
      fs.writeFileSync(path.join(workspace, 'new', 'deeper', 'after.txt'), 'new')
      const {names, entries, files} = await changesOf(workspace, since)
      // (an ext4's own lost+found is a name like any other)
      expect(names.filter((name) => name !== './lost+found')).toEqual([
        './before.txt',
        './new',
        './new/deeper',
        './new/deeper/after.txt',
      ])
      expect(files).toEqual(['new/deeper/after.txt'])
      // parents before their children, the content whole
      const order = entries.map((entry) => entry.name)
      expect(order.indexOf('./new/')).toBeLessThan(order.indexOf('./new/deeper/after.txt'))
      expect(entries.find((entry) => entry.type === '0')!.data.toString()).toBe('new')
      // the mark holds the run's id, for a helper that lists the changes again
      expect(fs.readFileSync(path.join(workspace, SYNC_DIR, 'mark'), 'utf8')).toBe('run_first\n')
      expect(names.some((name) => name.includes(SYNC_DIR))).toBe(false)
    })

    it('refuses a volume without the fill’s token as lost (an engine made it anew, another filled it), making nothing there', async () => {
      const fresh = fs.mkdtempSync(path.join(root, 'fresh-'))
      expect(() => markRunStart(fresh, syncGoLine('run_fresh', true, LIMIT, FILL))).toThrow(new LostVolume().message)
      expect(fs.readdirSync(fresh)).toEqual([])
      // another fill's token, a link to the right one, a FIFO (never waited on): each refused, the folder left as it was
      filled(fresh, 'f'.repeat(32))
      const token = path.join(fresh, SYNC_DIR, SYNC_FILL)
      fs.writeFileSync(path.join(root, 'right-token'), FILL)
      for (const plant of [
        () => undefined,
        () => (fs.rmSync(token), fs.symlinkSync(path.join(root, 'right-token'), token)),
        () => (fs.rmSync(token), execaSync('mkfifo', [token])),
      ]) {
        plant()
        expect(() => markRunStart(fresh, syncGoLine('run_other', true, LIMIT, FILL))).toThrow(LostVolume)
        expect(fs.readdirSync(path.join(fresh, SYNC_DIR))).toEqual([SYNC_FILL])
      }
      // the token kept through a run: the next one finds it
      filled(workspace)
      await startRun(workspace, syncGoLine('run_kept', false, LIMIT, FILL))
      expect(fs.readFileSync(path.join(workspace, SYNC_DIR, SYNC_FILL), 'utf8')).toBe(`${FILL}\n`)
      await startRun(workspace, syncGoLine('run_kept_again', false, LIMIT, FILL))
    })

    it('after a push, what the push wrote just before the go line is not the run’s', async () => {
      fs.writeFileSync(path.join(workspace, 'pushed.txt'), 'pushed')
      const since = await startRun(workspace, syncGoLine('run_pushed', true, LIMIT, FILL))
      fs.writeFileSync(path.join(workspace, 'mine.txt'), 'mine')
      expect((await changesOf(workspace, since)).files).toEqual(['mine.txt'])
    })

    it('a file whose time the run set back is still the run’s (ctime), and a rewritten one comes whole', async () => {
      const since = await startRun(workspace, syncGoLine('run_backdated', true, LIMIT, FILL))
      const file = path.join(workspace, 'backdated.txt')
      fs.writeFileSync(file, 'x'.repeat(3 * 1024 * 1024 + 7))
      fs.utimesSync(file, new Date(2000, 0, 1), new Date(2000, 0, 1))
      const {entries} = await changesOf(workspace, since)
      const sent = entries.find((entry) => entry.name === './backdated.txt')!
      expect(sent.data.length).toBe(3 * 1024 * 1024 + 7)
      expect(sent.mtimeMs).toBe(new Date(2000, 0, 1).getTime())
    })

    it('never follows what the last run planted: a link for its folder, a FIFO for its mark, links and FIFOs and odd names in the workspace', async () => {
      // a link for the folder: the volume is not the one the host filled, and it is never followed
      fs.rmSync(path.join(workspace, SYNC_DIR), {recursive: true, force: true})
      fs.symlinkSync(outside, path.join(workspace, SYNC_DIR))
      expect(() => markRunStart(workspace, syncGoLine('run_link', false, LIMIT, FILL))).toThrow(LostVolume)
      expect(fs.readdirSync(outside)).toEqual([])
      fs.rmSync(path.join(workspace, SYNC_DIR))
      filled(workspace)
      await startRun(workspace, syncGoLine('run_link', false, LIMIT, FILL))
      // a FIFO where the mark goes would block a writer that opened it; a stash beside it stays hidden
      fs.rmSync(path.join(workspace, SYNC_DIR, 'mark'))
      execaSync('mkfifo', [path.join(workspace, SYNC_DIR, 'mark')])
      fs.writeFileSync(path.join(workspace, SYNC_DIR, 'stash'), 'never listed')
      const since = await startRun(workspace, syncGoLine('run_fifo', false, LIMIT, FILL))
      expect(fs.readFileSync(path.join(workspace, SYNC_DIR, 'mark'), 'utf8')).toBe('run_fifo\n')
      expect(fs.readdirSync(path.join(workspace, SYNC_DIR))).not.toContain('stash')
      execaSync('mkfifo', [path.join(workspace, 'fifo')])
      fs.symlinkSync('/etc/passwd', path.join(workspace, 'link'))
      const odd = `a name with\nnewline, ünïcode and ${'long-'.repeat(40)}end`
      fs.writeFileSync(path.join(workspace, odd), 'odd')
      const longTarget = `${'far/'.repeat(40)}end`
      fs.symlinkSync(longTarget, path.join(workspace, 'long-link'))
      const {names, files, entries, changes} = await changesOf(workspace, since)
      expect(names).toEqual(expect.arrayContaining(['./fifo', './link', `./${odd}`]))
      // (in the mark's own second what the last test wrote then comes once more)
      expect(files).toContain(odd)
      expect(files).not.toEqual(expect.arrayContaining(['fifo']))
      expect(files).not.toEqual(expect.arrayContaining(['link']))
      // a link comes as itself, its target in its header, never what it points to
      const links = entries.filter((entry) => entry.type === '2')
      expect(links.map((entry) => [entry.name, entry.linkname, entry.data.length]).sort()).toEqual([
        ['./link', '/etc/passwd', 0],
        ['./long-link', longTarget, 0],
      ])
      // and GNU tar reads it so: the same archive extracted makes the same links
      const extracted = fs.mkdtempSync(path.join(root, 'extracted-'))
      const archive = path.join(root, 'changes.tar')
      fs.writeFileSync(archive, changes)
      execaSync('tar', ['-x', '-f', archive, '-C', extracted, './link', './long-link'])
      expect(fs.readlinkSync(path.join(extracted, 'long-link'))).toBe(longTarget)
      expect(fs.readlinkSync(path.join(extracted, 'link'))).toBe('/etc/passwd')
    })

    it('refuses a malformed go line', () => {
      expect(() => markRunStart(workspace, 'pushed ../../etc 1')).toThrow(/go line is malformed/)
      expect(() => markRunStart(workspace, 'later run_x 1')).toThrow(/go line is malformed/)
      expect(() => markRunStart(workspace, 'clean run_x')).toThrow(/go line is malformed/)
      expect(() => markRunStart(workspace, 'clean run_x 1')).toThrow(/go line is malformed/)
    })

    it('a folder the run moved brings its files, whose own times a rename leaves alone', async () => {
      fs.mkdirSync(path.join(workspace, 'reports', 'q'), {recursive: true})
      fs.writeFileSync(path.join(workspace, 'reports', 'q', 'q1.txt'), 'q1')
      await sleep(tick)
      const start = await startRun(workspace, syncGoLine('run_moved', false, LIMIT, FILL))
      fs.renameSync(path.join(workspace, 'reports'), path.join(workspace, 'archive'))
      const {names, files} = await changesOf(workspace, start)
      expect(files).toContain('archive/q/q1.txt')
      expect(names).not.toContain('./reports/q/q1.txt')
    })

    it('starts from the names a standby took only when the host says they are kept; else takes them anew', async () => {
      fs.mkdirSync(path.join(workspace, 'ledger', 'y'), {recursive: true})
      fs.writeFileSync(path.join(workspace, 'ledger', 'y', 'y1.txt'), 'y1')
      await sleep(tick)
      const taken = namesBeforeGo(workspace)!
      expect(taken.inodes.has('ledger/y/y1.txt')).toBe(true)
      // kept: nothing ran or was pushed since; those names are the start's, and a moved folder brings its files
      const kept = markRunStart(workspace, syncGoLine('run_taken', false, LIMIT, FILL, true), taken)
      expect(kept.before).toBe(taken.inodes)
      fs.renameSync(path.join(workspace, 'ledger'), path.join(workspace, 'books'))
      expect((await changesOf(workspace, kept)).files).toContain('books/y/y1.txt')
      // clean, not kept: another run moved the folder away after they were taken (books -> shelf
      // now), and this run moves it back: with the old names its file would keep its inode, unsent
      const stale = namesBeforeGo(workspace)!
      fs.renameSync(path.join(workspace, 'books'), path.join(workspace, 'shelf'))
      await sleep(tick)
      const clean = await startRun(workspace, syncGoLine('run_after_another', false, LIMIT, FILL), stale)
      expect(clean.before).not.toBe(stale.inodes)
      fs.renameSync(path.join(workspace, 'shelf'), path.join(workspace, 'books'))
      expect((await changesOf(workspace, clean)).files).toContain('books/y/y1.txt')
      // a push wrote after they were taken: they would call its file the run's
      const beforePush = namesBeforeGo(workspace)!
      fs.writeFileSync(path.join(workspace, 'pushed-by-host.txt'), 'from the host')
      await sleep(tick)
      const pushed = await startRun(workspace, syncGoLine('run_after_push', true, LIMIT, FILL, true), beforePush)
      expect(pushed.before).not.toBe(beforePush.inodes)
      expect((await changesOf(workspace, pushed)).files).not.toContain('pushed-by-host.txt')
      // another folder's names are never the start's
      const elsewhere = markRunStart(workspace, syncGoLine('run_elsewhere', false, LIMIT, FILL, true), {
        workspace: outside,
        inodes: new Map(),
      })
      expect(elsewhere.before).toBeUndefined()
      await new Promise((resolve) => setImmediate(resolve))
      expect(elsewhere.before?.has('books/y/y1.txt')).toBe(true)
    })

    it('never writes through a mark hard-linked to a workspace file; a run that ends at once sends by ctime alone', async () => {
      fs.writeFileSync(path.join(workspace, 'victim.txt'), 'mine')
      await startRun(workspace, syncGoLine('run_before_link', false, LIMIT, FILL))
      fs.rmSync(path.join(workspace, SYNC_DIR, 'mark'))
      fs.linkSync(path.join(workspace, 'victim.txt'), path.join(workspace, SYNC_DIR, 'mark'))
      await sleep(tick)
      // before the names of the start are taken (a run that failed at once): nothing counts as new
      const start = markRunStart(workspace, syncGoLine('run_linked_mark', false, LIMIT, FILL))
      expect(fs.readFileSync(path.join(workspace, 'victim.txt'), 'utf8')).toBe('mine')
      // (the unlink of the link stamps victim.txt in the mark's own tick: it may come once more, unchanged)
      const {files} = await changesOf(workspace, start)
      expect(files).not.toContain('before.txt')
    })

    it('sends a small trailer in one write (each write wakes the engine’s reader)', async () => {
      const writes: Buffer[] = []
      const out = new Writable({
        write: (chunk: Buffer, _encoding, done) => {
          writes.push(chunk)
          done()
        },
      })
      const start = await startRun(workspace, syncGoLine('run_one_write', false, LIMIT, FILL))
      fs.writeFileSync(path.join(workspace, 'small-change.txt'), 'x'.repeat(40_000))
      await sendWorkspaceChanges(workspace, start, out)
      fs.rmSync(path.join(workspace, 'small-change.txt'))
      expect(writes).toHaveLength(1)
      expect(writes[0]!.subarray(0, SYNC_TRAILER.length).toString()).toBe(SYNC_TRAILER)
      expect(writes[0]!.includes('x'.repeat(40_000))).toBe(true)
    })

    it('stops sending at limits.disk however often a file is linked, and never sends a name that is not UTF-8', async () => {
      const start = await startRun(workspace, syncGoLine('run_links', false, 4 * 1024 * 1024, FILL))
      fs.writeFileSync(path.join(workspace, 'one-mb'), Buffer.alloc(1024 * 1024, 1))
      for (let i = 0; i < 10; i++) fs.linkSync(path.join(workspace, 'one-mb'), path.join(workspace, `link-${i}`))
      const out = new PassThrough()
      let sent = 0
      out.on('data', (chunk: Buffer) => (sent += chunk.length))
      await expect(sendWorkspaceChanges(workspace, start, out)).rejects.toThrow(/larger than limits.disk/)
      expect(sent).toBeLessThanOrEqual(5 * 1024 * 1024 + 64 * 1024)
      for (const name of fs.readdirSync(workspace))
        if (/^(one-mb|link-)/.test(name)) fs.rmSync(path.join(workspace, name))
      // a name of bytes that are not UTF-8 reads as U+FFFD, as a real one would: refused, never guessed
      fs.mkdirSync(Buffer.from([...Buffer.from(workspace + '/d'), 0xff]))
      const bytesStart = await startRun(workspace, syncGoLine('run_bytes', false, LIMIT, FILL))
      await expect(sendWorkspaceChanges(workspace, bytesStart, new PassThrough())).rejects.toThrow(/not UTF-8/)
      fs.rmSync(Buffer.from([...Buffer.from(workspace + '/d'), 0xff]), {recursive: true})
    })

    if (coarse)
      it('sends a run’s changes when the run filled its volume (nothing of the trailer is written there)', async () => {
        const since = await startRun(workspace, syncGoLine('run_full', false, LIMIT, FILL))
        fs.writeFileSync(path.join(workspace, 'small.txt'), 'small')
        const fill = execaSync('dd', ['if=/dev/zero', `of=${path.join(workspace, 'fill')}`, 'bs=1M', 'count=100'], {
          reject: false,
        })
        expect(fill.stderr).toContain('No space left on device')
        const {files} = await changesOf(workspace, since, LIMIT)
        expect(files).toEqual(expect.arrayContaining(['fill', 'small.txt']))
        fs.rmSync(path.join(workspace, 'fill'))
      })
  })

describe('the warm-up a waiting standby runs on its own scratch', () => {
  let root: string
  beforeAll(() => void (root = fs.mkdtempSync(path.join(os.tmpdir(), 'meepa-sync-warm-test-'))))
  afterAll(() => fs.rmSync(root, {recursive: true, force: true}))

  it('leaves TMPDIR as it found it, and the run after it sends exactly its own changes', async () => {
    const tmp = path.join(root, 'tmp')
    const workspace = path.join(root, 'workspace')
    fs.mkdirSync(tmp)
    filled(workspace)
    fs.writeFileSync(path.join(tmp, 'theirs'), 'x')
    fs.writeFileSync(path.join(workspace, 'old.txt'), 'old')
    await sleep(30)
    await warmWorkspaceSync(tmp)
    expect(fs.readdirSync(tmp)).toEqual(['theirs'])
    expect(fs.readdirSync(workspace).sort()).toEqual([SYNC_DIR, 'old.txt'])
    const start = await startRun(workspace, syncGoLine('run_after_warm_up', false, LIMIT, FILL))
    fs.writeFileSync(path.join(workspace, 'new.txt'), 'new')
    const {names, files} = await changesOf(workspace, start)
    expect(files).toEqual(['new.txt'])
    expect(names).toEqual(['./new.txt', './old.txt'])
  })

  it('fails, touching nothing, where TMPDIR cannot be written (agent-run goes on without it)', async () => {
    await expect(warmWorkspaceSync(path.join(root, 'missing'))).rejects.toThrow(/ENOENT/)
    expect(fs.existsSync(path.join(root, 'missing'))).toBe(false)
  })
})

describe('agent-run’s stdin with a go line before the input', () => {
  const feed = async (chunks: string[]) => {
    const stream = new PassThrough()
    const reader = new StdinReader(stream, {goLine: true})
    for (const chunk of chunks) stream.write(chunk)
    stream.end()
    return reader
  }

  it('takes the go line, then the input, whatever the pieces they come in', async () => {
    const reader = await feed(['pus', 'hed run_1', '\n{"a":', '1}\n'])
    expect(await reader.goLine).toBe('pushed run_1')
    expect(JSON.parse(await reader.input)).toEqual({a: 1})
    const whole = await feed(['clean run_2\n{"b":2}\n'])
    expect(await whole.goLine).toBe('clean run_2')
    expect(JSON.parse(await whole.input)).toEqual({b: 2})
  })

  it('refuses stdin that ends before the go line, or runs on without one', async () => {
    await expect((await feed(['clean'])).goLine).rejects.toThrow(/ended before the go line/)
    await expect((await feed(['x'.repeat(400)])).goLine).rejects.toThrow(/go line before the input is too long/)
  })
})
