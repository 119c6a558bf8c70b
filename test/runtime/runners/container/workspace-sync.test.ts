import {execaSync} from 'execa'
import fs from 'node:fs'
import os from 'node:os'
import path from 'node:path'
import {afterEach, beforeEach, describe, expect, it, vi} from 'vitest'
import {
  applyChanges,
  forgetVolume,
  pullWorkspace,
  snapshotWorkspace,
  syncedVolume,
  syncAside,
  type Snapshot,
  type SyncedVolume,
} from '../../../../src/runtime/runners/container/workspace-sync.js'
import {bufferSource} from '../../../../src/runtime/util/spooled-bytes.js'
import {readTar, writeTar, type TarInput} from '../../../../src/runtime/util/tar.js'
import type {GatewayError} from '../../../../src/runtime/util/errors.js'
import {watchLoopGaps} from '../../../helpers/loop-gaps.js'
import {syncStateFile} from '../../../../src/runtime/container/engine-state.js'
import {namesKept} from '../../../../src/runtime/runners/container/runner.js'
import type {AgentContainer} from '../../../../src/runtime/runners/container/agent-container.js'

/*
 * The host side of the remote-engine workspace sync, fed hostile archives as an agent on the
 * engine could make them: nothing may be created outside the workspace, nothing but regular files,
 * folders and symbolic links (made as links, never followed) may appear in it, and no planted link
 * may be written through.
 */

const openReal = fs.openSync.bind(fs) as (file: fs.PathLike, ...rest: unknown[]) => number
const fsyncReal = fs.fsyncSync.bind(fs)
const fsyncCallback = fs.fsync.bind(fs)
const closeCallback = fs.close.bind(fs) as (fd: number, done: (error: NodeJS.ErrnoException | null) => void) => void

const file = (name: string, text: string, mode = 0o644): TarInput => ({
  name,
  type: '0',
  mode,
  mtimeMs: Date.now(),
  data: Buffer.from(text),
})

/** A tar with entries of any type, as a hostile engine-side `tar` could make. */
function rawTar(entries: Array<{name: string; type: string; data?: string; linkname?: string}>): Buffer {
  const normal = writeTar(entries.map((entry) => file(entry.name, entry.data ?? '')))
  // rewrite each header's type (and link name) in place, fixing the checksum (names stay short: no PAX)
  let at = 0
  for (const entry of entries) {
    const block = normal.subarray(at, at + 512)
    block.write(entry.type, 156, 'ascii')
    if (entry.linkname) block.write(entry.linkname, 157, 'utf8')
    block.write('        ', 148, 'ascii')
    let sum = 0
    for (const byte of block) sum += byte
    block.write(sum.toString(8).padStart(6, '0') + '\0 ', 148, 'ascii')
    at += 512 + Math.ceil((entry.data ?? '').length / 512) * 512
  }
  return normal
}

describe('taking a run’s changes back from a remote engine', () => {
  let root: string
  let workspace: string
  let outside: string
  const logged: string[] = []
  const apply = (tar: Buffer, present: string[] = [], synced = snapshotWorkspace(workspace)) =>
    applyChanges(workspace, tar, new Set(present), synced, {maxBytes: 1024 * 1024, log: (line) => logged.push(line)})
  /** pullWorkspace given the run's trailer: every name in the volume, and the change tar (no engine is asked). */
  /** pullWorkspace, and its fsyncs after the reply (`settled`) done. */
  const pull = async (state: SyncedVolume, names: string[], changes: Buffer, maxBytes = 1024 * 1024) => {
    const taken = await pullBeforeSettled(state, names, changes, maxBytes)
    await taken.settled
    return taken
  }
  const pullBeforeSettled = (state: SyncedVolume, names: string[], changes: Buffer, maxBytes = 1024 * 1024) =>
    pullWorkspace(undefined as never, state, {
      runId: 'run_test',
      pushed: false,
      workspace,
      maxBytes,
      log: (line) => logged.push(line),
      trailer: {
        list: bufferSource(Buffer.from(names.map((name) => `./${name}\0`).join(''))),
        changes: bufferSource(changes),
        close: () => {},
      },
      helper: {image: 'unused', uid: 1000, gid: 1000, labels: {}},
    })

  /** What `work` opened with fs.openSync, each as the path its descriptor reached. */
  const openedDuring = async (work: () => Promise<void>): Promise<string[]> => {
    const opened: string[] = []
    const open = vi.spyOn(fs, 'openSync')
    open.mockImplementation(((file: fs.PathLike, ...rest: unknown[]) => {
      const fd = openReal(file, ...rest)
      opened.push(fs.realpathSync(`/proc/self/fd/${fd}`))
      return fd
    }) as typeof fs.openSync)
    try {
      await work()
    } finally {
      open.mockRestore()
    }
    return opened
  }

  beforeEach(() => {
    root = fs.mkdtempSync(path.join(os.tmpdir(), 'meepa-sync-'))
    workspace = path.join(root, 'ws')
    outside = path.join(root, 'outside')
    fs.mkdirSync(workspace)
    fs.mkdirSync(outside)
    logged.length = 0
  })
  afterEach(() => fs.rmSync(root, {recursive: true, force: true}))

  it('keeps what the host changed during the run: never overwritten, removed or brought back', async () => {
    fs.writeFileSync(path.join(workspace, 'soul.md'), 'as the run started')
    fs.writeFileSync(path.join(workspace, 'notes.md'), 'as the run started')
    fs.writeFileSync(path.join(workspace, 'old.md'), 'as the run started')
    const synced = snapshotWorkspace(workspace)
    // during the run: the operator saves soul.md and notes.md in the dashboard, removes old.md
    const later = new Date(Date.now() + 5000)
    fs.writeFileSync(path.join(workspace, 'soul.md'), 'saved in the dashboard')
    fs.writeFileSync(path.join(workspace, 'notes.md'), 'saved too')
    fs.utimesSync(path.join(workspace, 'soul.md'), later, later)
    fs.utimesSync(path.join(workspace, 'notes.md'), later, later)
    fs.rmSync(path.join(workspace, 'old.md'))
    // the run lists soul.md and old.md as changed (the last run's writes in its mark's tick), and removed notes.md
    const {received, kept} = await apply(
      writeTar([file('soul.md', 'as the run started'), file('old.md', 'as the run started'), file('new.md', 'made')]),
      ['soul.md', 'old.md', 'new.md'],
      synced,
    )
    expect(fs.readFileSync(path.join(workspace, 'soul.md'), 'utf8')).toBe('saved in the dashboard')
    expect(fs.readFileSync(path.join(workspace, 'notes.md'), 'utf8')).toBe('saved too')
    expect(fs.existsSync(path.join(workspace, 'old.md'))).toBe(false)
    expect(fs.readFileSync(path.join(workspace, 'new.md'), 'utf8')).toBe('made')
    expect(received).toBe(1)
    expect(kept.sort()).toEqual(['notes.md', 'old.md', 'soul.md'])
    expect(logged.join('\n')).toMatch(/"soul.md" stays as it is: it was changed or removed on the host during the run/)
  })

  it('records what the run brought back, and leaves every other name as the push sent it: a change the host made meanwhile is sent next', async () => {
    fs.writeFileSync(path.join(workspace, 'edited.md'), 'as the run started')
    fs.writeFileSync(path.join(workspace, 'removed-by-run.md'), 'x')
    fs.mkdirSync(path.join(workspace, 'folder'))
    fs.writeFileSync(path.join(workspace, 'folder', 'was.txt'), 'was')
    fs.mkdirSync(path.join(workspace, 'emptied'))
    fs.writeFileSync(path.join(workspace, 'emptied', 'gone.txt'), 'gone')
    const synced = snapshotWorkspace(workspace)
    // during the run: the operator edits one file and adds one to a folder the run removes whole
    const later = new Date(Date.now() + 5000)
    fs.writeFileSync(path.join(workspace, 'edited.md'), 'edited on the host')
    fs.utimesSync(path.join(workspace, 'edited.md'), later, later)
    fs.writeFileSync(path.join(workspace, 'folder', 'added.txt'), 'added')
    const {record} = await apply(writeTar([file('made.txt', 'made by the run')]), ['edited.md', 'made.txt'], synced)
    // the host keeps the new file and its folder; the run's other removals stand
    expect(fs.readdirSync(path.join(workspace, 'folder'))).toEqual(['added.txt'])
    expect(fs.existsSync(path.join(workspace, 'emptied'))).toBe(false)
    expect(fs.existsSync(path.join(workspace, 'removed-by-run.md'))).toBe(false)
    expect(logged.join('\n')).toMatch(/"folder" stays: it still holds something the run did not have/)
    const made = fs.statSync(path.join(workspace, 'made.txt'))
    expect(record).toEqual({
      // as the push sent it, so unlike the host's edit
      'edited.md': synced['edited.md'],
      'made.txt': [made.size, made.mtimeMs, 'f'],
    })
    // the next push's view: what differs from the record is exactly what the volume lacks
    const host = snapshotWorkspace(workspace)
    const differs = Object.keys(host).filter((name) => JSON.stringify(host[name]) !== JSON.stringify(record![name]))
    expect(differs.sort()).toEqual(['edited.md', 'folder', 'folder/added.txt'])
  })

  it('records a name whose entry the host could not take as the kind the volume has, nothing below it: the next push replaces it whole', async () => {
    fs.mkdirSync(path.join(workspace, 'd'))
    fs.writeFileSync(path.join(workspace, 'd', 'a'), 'a')
    fs.writeFileSync(path.join(workspace, 'was-a-file'), 'host')
    fs.mkdirSync(path.join(workspace, 'x'))
    const synced = snapshotWorkspace(workspace)
    fs.writeFileSync(path.join(workspace, 'd', 'new'), 'the operator, during the run')
    // the run made the folder d a file, the file was-a-file a folder with a file in it; a hostile
    // archive lists x/c before making its parent x a file
    const {record} = await apply(
      writeTar([
        file('d', 'the run made d a file'),
        {name: 'was-a-file', type: '5', mode: 0o755, mtimeMs: 0, data: Buffer.alloc(0)},
        file('was-a-file/inside', 'x'),
        file('x/c', 'c'),
        file('x', 'x'),
        file('x/after', 'after'),
      ]),
      ['d', 'was-a-file', 'was-a-file/inside', 'x', 'x/c', 'x/after'],
      synced,
    )
    // the host's own entries stand; what the run removed with its folder (d/a) is removed
    expect(fs.readdirSync(path.join(workspace, 'd'))).toEqual(['new'])
    expect(fs.readFileSync(path.join(workspace, 'was-a-file'), 'utf8')).toBe('host')
    expect(record!.d).toEqual([-1, -1, 'f'])
    expect(record!['was-a-file']).toEqual([-1, -1, 'd'])
    expect(record!.x).toEqual([-1, -1, 'f'])
    expect(Object.keys(record!).filter((name) => /^(d|x)\//.test(name))).toEqual([])
    // the next push: each differs in kind from the host's, so the volume's is removed and the host's sent whole
    const host = snapshotWorkspace(workspace)
    for (const name of ['d', 'was-a-file', 'x']) expect(record![name]![2]).not.toBe(host[name]![2])
    for (const name of ['d/a', 'd/new', 'x/c', 'x/after']) expect(record![name]).toBeUndefined()
  })

  it('records a hostile archive of many refused names in one pass over the record, not one per name', async () => {
    for (let i = 0; i < 5_000; i++) fs.mkdirSync(path.join(workspace, `dir${i}`))
    fs.writeFileSync(path.join(workspace, 'host-file'), 'host')
    const synced = snapshotWorkspace(workspace)
    // every folder made a file (each refused), and names under the host's file (refused, new to both)
    const made = Array.from({length: 5_000}, (_, i) => file(`dir${i}`, ''))
    const under = Array.from({length: 5_000}, (_, i) => file(`host-file/n${i}`, ''))
    const tar = writeTar([...made, ...under])
    const passes = vi.spyOn(Object, 'keys')
    let record: Snapshot | undefined
    try {
      record = (await apply(tar, [...Object.keys(synced), ...under.map((entry) => entry.name)], synced)).record
      expect(passes.mock.calls.length).toBeLessThan(10)
    } finally {
      passes.mockRestore()
    }
    expect(record!.dir42).toEqual([-1, -1, 'f'])
    // nothing recorded of what neither side had before: the record stays the host's size
    expect(Object.keys(record!)).toHaveLength(Object.keys(synced).length)
    expect(fs.readFileSync(path.join(workspace, 'host-file'), 'utf8')).toBe('host')
  })

  it('writes files and folders, and removes what the run removed', async () => {
    fs.writeFileSync(path.join(workspace, 'gone.txt'), 'old')
    fs.writeFileSync(path.join(workspace, 'kept.txt'), 'kept')
    const written = await apply(
      writeTar([
        {name: 'd', type: '5', mode: 0o755, mtimeMs: 0, data: Buffer.alloc(0)},
        file('d/new.txt', 'new'),
        file(`${'long-name-'.repeat(15)}.txt`, 'pax'),
      ]),
      ['kept.txt', 'd', 'd/new.txt'],
    )
    expect(written.received).toBe(2)
    expect(fs.readFileSync(path.join(workspace, 'd/new.txt'), 'utf8')).toBe('new')
    expect(fs.readFileSync(path.join(workspace, `${'long-name-'.repeat(15)}.txt`), 'utf8')).toBe('pax')
    expect(fs.existsSync(path.join(workspace, 'gone.txt'))).toBe(false)
    expect(fs.readFileSync(path.join(workspace, 'kept.txt'), 'utf8')).toBe('kept')
  })

  it('brings back a file and a link whose names are as long as a folder entry can be (its temporaries are short)', async () => {
    const name = `${'n'.repeat(246)}.txt` // 250 bytes
    const link = 'l'.repeat(255)
    const {received} = await apply(
      writeTar([
        file(name, 'long'),
        {name: link, type: '2', mode: 0o777, mtimeMs: 0, data: Buffer.alloc(0), linkname: name},
      ]),
      [name, link],
    )
    expect(received).toBe(2)
    expect(fs.readFileSync(path.join(workspace, name), 'utf8')).toBe('long')
    expect(fs.readlinkSync(path.join(workspace, link))).toBe(name)
    expect(logged).toEqual([])
    // no temporary is left beside them
    expect(fs.readdirSync(workspace).sort()).toEqual([link, name])
  })

  it('writes a file whole when the host’s disk takes each write in part', async () => {
    const real = fs.writeSync.bind(fs) as (fd: number, data: Buffer, offset: number, length: number) => number
    const spy = vi.spyOn(fs, 'writeSync')
    spy.mockImplementation(((fd: number, data: Buffer, offset = 0, length = data.length - offset) =>
      real(fd, data, offset, Math.min(length, 1000))) as never)
    try {
      await apply(writeTar([file('whole.txt', 'x'.repeat(10_000))]), ['whole.txt'])
    } finally {
      spy.mockRestore()
    }
    expect(fs.readFileSync(path.join(workspace, 'whole.txt'), 'utf8')).toBe('x'.repeat(10_000))
  })

  it('fails the take-back, naming the entry, when the host cannot write or remove a change; what the volume holds is forgotten', async () => {
    fs.writeFileSync(path.join(workspace, 'gone.txt'), 'the run removed it')
    const bad = 'full\n"disk.txt' // quoted in the error as the agent's name, never as raw bytes
    for (const [failing, what, code, said] of [
      ['writeSync', 'written', 'ENOSPC', "the host's disk is full (ENOSPC)"],
      ['rmSync', 'removed', 'EACCES', "the gateway's user may not write there (EACCES)"],
    ] as const) {
      const record = path.join(root, `record-${code}`)
      fs.writeFileSync(record, JSON.stringify(snapshotWorkspace(workspace)))
      const state: SyncedVolume = {volume: 'unused', synced: snapshotWorkspace(workspace), file: record, spoolDir: root}
      const real = fs[failing].bind(fs) as (...args: unknown[]) => unknown
      const spy = vi.spyOn(fs, failing)
      spy.mockImplementation(((...args: unknown[]) => {
        const target = typeof args[0] === 'number' ? fs.readlinkSync(`/proc/self/fd/${args[0]}`) : String(args[0])
        if (path.basename(target).startsWith('.m-') || path.basename(target) === 'gone.txt')
          throw Object.assign(new Error(`${code}: failed, '${target}'`), {code})
        return real(...args)
      }) as never)
      let failed: GatewayError | undefined
      try {
        await pull(
          state,
          ['ok.txt', bad],
          writeTar(failing === 'writeSync' ? [file(bad, 'x')] : [file('ok.txt', 'fine')]),
        )
      } catch (error) {
        failed = error as GatewayError
      } finally {
        spy.mockRestore()
      }
      const name = failing === 'writeSync' ? bad : 'gone.txt'
      expect(failed?.code).toBe('E_WORKSPACE')
      expect(failed?.message).toBe(`${JSON.stringify(name)} could not be ${what} on the host: ${said}`)
      expect(failed?.suggestions.join(' ')).toMatch(/send the message again/)
      // no record: the next push empties the volume and sends the host's workspace whole
      expect(state.synced).toBeUndefined()
      expect(fs.existsSync(record)).toBe(false)
    }
  })

  it('replies with the changes in place, then has every name and the record on the disk before the run ends', async () => {
    fs.mkdirSync(path.join(workspace, 'old'))
    fs.writeFileSync(path.join(workspace, 'old', 'gone.txt'), 'old')
    fs.mkdirSync(path.join(workspace, 'untouched'))
    const state: SyncedVolume = {
      volume: 'unused',
      synced: snapshotWorkspace(workspace),
      file: path.join(root, 'record'),
      spoolDir: root,
    }
    const opened = new Map<number, string>()
    const fsynced = new Set<string>()
    const open = vi.spyOn(fs, 'openSync')
    const fsyncNow = vi.spyOn(fs, 'fsyncSync')
    const fsyncAside = vi.spyOn(fs, 'fsync')
    open.mockImplementation(((file: fs.PathLike, ...rest: unknown[]) => {
      const fd = openReal(file, ...rest)
      opened.set(fd, path.resolve(String(file)))
      return fd
    }) as typeof fs.openSync)
    fsyncNow.mockImplementation((fd: number) => {
      fsyncReal(fd)
      fsynced.add(opened.get(fd) ?? '?')
    })
    fsyncAside.mockImplementation(((fd: number, done: (error: NodeJS.ErrnoException | null) => void) =>
      fsyncCallback(fd, (error) => {
        if (!error) fsynced.add(opened.get(fd) ?? '?')
        done(error)
      })) as typeof fs.fsync)
    const real = fs.realpathSync(workspace)
    const named = (kind: 'folder' | 'file') =>
      [...fsynced]
        .filter((name) => name.startsWith(real) && fs.existsSync(name))
        .filter((name) => fs.statSync(name).isDirectory() === (kind === 'folder'))
        .map((name) => path.relative(real, fs.realpathSync(name)) || '.')
        .sort()
    const record = () => JSON.parse(fs.readFileSync(state.file, 'utf8')) as {files: Snapshot; unsettledIn?: string}
    try {
      const changes = writeTar([
        {name: 'd', type: '5', mode: 0o755, mtimeMs: 0, data: Buffer.alloc(0)},
        file('d/new.txt', 'new'),
        file('top.txt', 'top'),
        file('e/f/unlisted-folders.txt', 'made'), // an archive that does not list e and e/f
      ])
      const names = ['untouched', 'd', 'd/new.txt', 'top.txt', 'e', 'e/f', 'e/f/unlisted-folders.txt']
      const taken = await pullBeforeSettled(state, names, changes)
      // the reply's moment: every change in place, nothing of it fsynced yet, the record bound to this boot
      expect(fs.readFileSync(path.join(workspace, 'e/f/unlisted-folders.txt'), 'utf8')).toBe('made')
      expect(fs.existsSync(path.join(workspace, 'old'))).toBe(false)
      expect(fsynced.size).toBe(0)
      expect(record().unsettledIn).toBe(fs.readFileSync('/proc/sys/kernel/random/boot_id', 'utf8').trim())
      await taken.settled
    } finally {
      open.mockRestore()
      fsyncNow.mockRestore()
      fsyncAside.mockRestore()
    }
    // the workspace (top.txt, d and e made, old removed), d (new.txt), e (f made), e/f (its file);
    // old's removal of gone.txt (old is gone)
    expect(named('folder')).toEqual(['.', 'd', 'e', 'e/f'])
    expect(named('file')).toEqual(['d/new.txt', 'e/f/unlisted-folders.txt', 'top.txt'])
    // then the record, for any boot
    expect(record().unsettledIn).toBeUndefined()
    expect(Object.keys(record().files).sort()).toEqual([
      'd',
      'd/new.txt',
      'e/f/unlisted-folders.txt',
      'top.txt',
      'untouched',
    ])
    expect(syncedVolume(root, 'remote', 'label', 'a').synced).toBeUndefined() // another agent's: none
  })

  it('lets a standby start from its names only at the generation it started at: no run or push since', async () => {
    const volumeOf = () => syncedVolume(root, 'remote', 'label', 'agent')
    const state = volumeOf()
    state.synced = {}
    state.fill = 'b'.repeat(32)
    await pull(state, ['a.txt'], writeTar([file('a.txt', 'a')]))
    // the run whose changes were taken last is the volume's generation, on the disk for the next message
    expect(volumeOf().generation).toBe('run_test')
    const standby = (syncGeneration?: string) => ({syncGeneration}) as AgentContainer
    expect(namesKept(standby('run_test'), volumeOf(), false)).toBe(true)
    // this message's push wrote; a run (a fresh container's, another process's) came after it started
    expect(namesKept(standby('run_test'), volumeOf(), true)).toBe(false)
    expect(namesKept(standby('run_before'), volumeOf(), false)).toBe(false)
    // a standby that started before any generation, and a fresh container
    expect(namesKept(standby(undefined), volumeOf(), false)).toBe(false)
    expect(namesKept(undefined, volumeOf(), false)).toBe(false)
    // a forgotten volume has none: it is filled (pushed) before anything runs there
    forgetVolume(state)
    expect(volumeOf().generation).toBeUndefined()
    expect(namesKept(standby('run_test'), volumeOf(), false)).toBe(false)
  })

  it('fsyncs a file its owner cannot read before its rename: the late pass could not open it', async () => {
    const state: SyncedVolume = {volume: 'unused', synced: {}, file: path.join(root, 'record'), spoolDir: root}
    const opened = new Map<number, string>()
    const fsynced: string[] = []
    const open = vi.spyOn(fs, 'openSync')
    const fsyncNow = vi.spyOn(fs, 'fsyncSync')
    open.mockImplementation(((name: fs.PathLike, ...rest: unknown[]) => {
      const fd = openReal(name, ...rest)
      opened.set(fd, path.basename(String(name)))
      return fd
    }) as typeof fs.openSync)
    fsyncNow.mockImplementation((fd: number) => {
      fsyncReal(fd)
      fsynced.push(opened.get(fd) ?? '?')
    })
    let settledWell = false
    try {
      const changes = writeTar([file('write-only.txt', 'w', 0o200), file('readable.txt', 'r')])
      const taken = await pullBeforeSettled(state, ['write-only.txt', 'readable.txt'], changes)
      // one temp fsynced before the reply: the write-only file's (the readable one's comes after it)
      expect(fsynced.filter((name) => name.endsWith('.tmp'))).toHaveLength(1)
      await taken.settled.then(() => (settledWell = true))
    } finally {
      open.mockRestore()
      fsyncNow.mockRestore()
    }
    expect(settledWell).toBe(true)
    expect(fs.statSync(path.join(workspace, 'write-only.txt')).mode & 0o777).toBe(0o200)
  })

  it('trusts a record its take-back had not settled only in the boot that wrote it', () => {
    const engineState = path.dirname(syncedVolume(root, 'remote', 'label', 'agent').file)
    const write = (record: object) => {
      fs.mkdirSync(engineState, {recursive: true})
      fs.writeFileSync(syncedVolume(root, 'remote', 'label', 'agent').file, JSON.stringify(record))
    }
    const fill = 'a'.repeat(32)
    const files: Snapshot = {'memory.db': [4096, 1, 'f']}
    const boot = fs.readFileSync('/proc/sys/kernel/random/boot_id', 'utf8').trim()
    write({fill, files, unsettledIn: boot})
    expect(syncedVolume(root, 'remote', 'label', 'agent').synced).toEqual(files)
    // a machine that lost power before the fsyncs: what its disk kept is unknown, the volume filled whole
    write({fill, files, unsettledIn: '00000000-0000-0000-0000-000000000000'})
    expect(syncedVolume(root, 'remote', 'label', 'agent').synced).toBeUndefined()
    expect(syncedVolume(root, 'remote', 'label', 'agent').fill).toBeUndefined()
    // settled: any boot
    write({fill, files})
    expect(syncedVolume(root, 'remote', 'label', 'agent').synced).toEqual(files)
  })

  it('knows a volume only with its fill’s token: a record without one (an older gateway’s) is of an unknown volume', () => {
    const file = syncStateFile(root, 'far', 'a1')
    fs.mkdirSync(path.dirname(file), {recursive: true})
    const files: Snapshot = {'a.txt': [1, 2, 'f']}
    fs.writeFileSync(file, JSON.stringify({fill: 'd'.repeat(32), files}))
    expect(syncedVolume(root, 'far', 'label', 'a1')).toMatchObject({synced: files, fill: 'd'.repeat(32)})
    for (const record of [files, {fill: 'not hex', files}, {fill: 'd'.repeat(32)}]) {
      fs.writeFileSync(file, JSON.stringify(record))
      expect(syncedVolume(root, 'far', 'label', 'a1')).toMatchObject({synced: undefined, fill: undefined})
    }
  })

  it('forgets what the volume holds for good: a crash cannot bring back a record the next push would trust', () => {
    const state: SyncedVolume = {
      volume: 'unused',
      synced: snapshotWorkspace(workspace),
      file: path.join(root, 'record'),
      spoolDir: root,
    }
    fs.writeFileSync(state.file, JSON.stringify(state.synced))
    const fsynced: string[] = []
    const opened = new Map<number, string>()
    const open = vi.spyOn(fs, 'openSync').mockImplementation(((file: fs.PathLike, ...rest: unknown[]) => {
      const fd = openReal(file, ...rest)
      opened.set(fd, path.resolve(String(file)))
      return fd
    }) as typeof fs.openSync)
    const fsync = vi.spyOn(fs, 'fsyncSync').mockImplementation((fd: number) => {
      fsyncReal(fd)
      fsynced.push(opened.get(fd) ?? '?')
    })
    try {
      forgetVolume(state)
    } finally {
      open.mockRestore()
      fsync.mockRestore()
    }
    expect(fs.existsSync(state.file)).toBe(false)
    expect(state.synced).toBeUndefined()
    expect(fsynced).toEqual([path.resolve(root)])
  })

  it('keeps few folders open at once however many the run made: the gateway’s descriptors are everyone’s', async () => {
    const state: SyncedVolume = {volume: 'unused', synced: {}, file: path.join(root, 'record'), spoolDir: root}
    const made = Array.from({length: 300}, (_, i) => `f${i}`)
    const real = fs.realpathSync(workspace)
    const openFolders = new Set<number>()
    let opened = 0
    let most = 0
    const open = vi.spyOn(fs, 'openSync')
    const close = vi.spyOn(fs, 'close')
    open.mockImplementation(((file: fs.PathLike, ...rest: unknown[]) => {
      const fd = openReal(file, ...rest)
      const name = path.resolve(String(file))
      if (name.startsWith(real) && fs.statSync(name).isDirectory()) {
        openFolders.add(fd)
        opened++
      }
      most = Math.max(most, openFolders.size)
      return fd
    }) as typeof fs.openSync)
    close.mockImplementation(((fd: number, done: (error: NodeJS.ErrnoException | null) => void) => {
      openFolders.delete(fd)
      closeCallback(fd, done)
    }) as typeof fs.close)
    try {
      await pull(
        state,
        made.flatMap((dir) => [dir, `${dir}/x`]),
        writeTar(
          made.flatMap((dir) => [
            {name: dir, type: '5' as const, mode: 0o755, mtimeMs: 0, data: Buffer.alloc(0)},
            file(`${dir}/x`, dir),
          ]),
        ),
        16 * 1024 * 1024,
      )
    } finally {
      open.mockRestore()
      close.mockRestore()
    }
    expect(fs.readFileSync(path.join(workspace, 'f299', 'x'), 'utf8')).toBe('f299')
    // every folder was opened for its fsync (the workspace and 300 made), never more than a few at once
    expect(opened).toBe(301)
    expect(most).toBeGreaterThan(1)
    expect(most).toBeLessThanOrEqual(8)
    expect(openFolders.size).toBe(0)
  })

  it('fsyncs no folder through a link, and never waits on a FIFO put at a folder’s name', async () => {
    fs.mkdirSync(path.join(workspace, 'real'))
    fs.symlinkSync(outside, path.join(workspace, 'link'))
    execaSync('mkfifo', [path.join(workspace, 'fifo')])
    const opened = await openedDuring(() => syncAside(workspace, ['real', 'link', 'fifo', 'gone'], 'folder'))
    expect(opened).toEqual([fs.realpathSync(path.join(workspace, 'real'))])
  })

  it('fsyncs only regular files after a reply: never through a link, a FIFO, a device or a folder', async () => {
    fs.writeFileSync(path.join(workspace, 'real.txt'), 'x')
    fs.writeFileSync(path.join(outside, 'secret'), 'x')
    fs.symlinkSync(path.join(outside, 'secret'), path.join(workspace, 'link'))
    fs.symlinkSync(outside, path.join(workspace, 'linked-folder'))
    fs.symlinkSync('/dev/null', path.join(workspace, 'device-link'))
    // a device node needs root (as CI runs); elsewhere the link to one stands for it
    if (process.getuid?.() === 0) execaSync('mknod', [path.join(workspace, 'device'), 'c', '1', '3'])
    execaSync('mkfifo', [path.join(workspace, 'fifo')])
    fs.mkdirSync(path.join(workspace, 'dir'))
    const real = fs.realpathSync(path.join(workspace, 'real.txt'))
    const names = ['real.txt', 'link', 'linked-folder/secret', 'device-link', 'device', 'fifo', 'dir', 'gone']
    const opened = await openedDuring(async () => {
      await syncAside(workspace, names, 'file')
      fs.rmSync(workspace, {recursive: true}) // a workspace removed meanwhile: nothing to keep
      await syncAside(workspace, ['real.txt'], 'file')
    })
    expect(opened).toEqual([real])
  })

  it('leaves names deeper than 256 folders, and keeps the event loop turning while a long archive is applied', async () => {
    const deep = Array.from({length: 300}, () => 'd').join('/')
    const many = Array.from({length: 400}, (_, index) => file(`${'n/'.repeat(30)}f${index}`, 'x'))
    const tar = writeTar([file(`${deep}/too-deep`, 'x'), ...many])
    const gaps = watchLoopGaps()
    const started = performance.now()
    const {received} = await apply(
      tar,
      many.map((entry) => entry.name),
    )
    const took = performance.now() - started
    const longestGap = gaps.stop()
    expect(received).toBe(400)
    expect(fs.existsSync(path.join(workspace, 'd'))).toBe(false)
    expect(logged).toContain(
      `workspace sync: not brought back: ${JSON.stringify(`${deep}/too-deep`)} is more than 256 folders deep`,
    )
    // the whole apply took many turns' worth; no single stretch of it held the loop for more than a few
    expect(took).toBeGreaterThan(300)
    expect(longestGap).toBeLessThan(Math.min(150, took / 3))
  })

  it('never leaves the workspace: `..`, absolute names, hardlinks, FIFOs and devices are skipped; a link is only a link', async () => {
    await apply(
      rawTar([
        {name: '../outside/escaped', type: '0', data: 'x'},
        {name: '/tmp/absolute', type: '0', data: 'x'},
        {name: 'a/../../outside/dotdot', type: '0', data: 'x'},
        {name: 'link', type: '2', linkname: '/etc/passwd'},
        {name: 'hard', type: '1', linkname: '/etc/shadow'},
        {name: 'fifo', type: '6'},
        {name: 'dev', type: '3'},
        {name: 'ok', type: '0', data: 'fine'},
      ]),
    )
    expect(fs.readdirSync(outside)).toEqual([])
    expect(fs.existsSync('/tmp/absolute')).toBe(false)
    expect(fs.readdirSync(workspace).sort()).toEqual(['link', 'ok'])
    expect(fs.readlinkSync(path.join(workspace, 'link'))).toBe('/etc/passwd')
    expect(logged.filter((line) => line.includes('not brought back'))).toHaveLength(6)
  })

  it('makes the run’s symbolic links as it left them, never following one, and removes those it removed', async () => {
    fs.writeFileSync(path.join(workspace, 'was-a-file'), 'old')
    fs.symlinkSync(path.join(outside, 'victim'), path.join(workspace, 'was-a-link'))
    fs.writeFileSync(path.join(outside, 'victim'), 'untouched')
    fs.symlinkSync('gone-target', path.join(workspace, 'removed-link'))
    fs.symlinkSync(outside, path.join(workspace, 'parent-link'))
    fs.mkdirSync(path.join(workspace, 'a-folder'))
    const longTarget = `${'deep/'.repeat(40)}end`
    const link = (name: string, linkname: string): TarInput => ({
      name,
      type: '2',
      mode: 0o777,
      mtimeMs: 0,
      data: Buffer.alloc(0),
      linkname,
    })
    const {received} = await apply(
      writeTar([
        link('latest', 'releases/v2'),
        link('was-a-file', '/etc/shadow'),
        link('was-a-link', 'elsewhere'),
        link('long', longTarget),
        link('parent-link/escape', '/etc/passwd'),
        link('a-folder', '/'),
      ]),
      ['latest', 'was-a-file', 'was-a-link', 'long', 'parent-link', 'a-folder'],
    )
    expect(received).toBe(4)
    for (const [name, target] of [
      ['latest', 'releases/v2'],
      ['was-a-file', '/etc/shadow'],
      ['was-a-link', 'elsewhere'],
      ['long', longTarget],
    ])
      expect(fs.readlinkSync(path.join(workspace, name!))).toBe(target)
    // the old link was replaced, not written through; nothing was made through the planted parent
    expect(fs.readFileSync(path.join(outside, 'victim'), 'utf8')).toBe('untouched')
    expect(fs.readdirSync(outside)).toEqual(['victim'])
    expect(fs.lstatSync(path.join(workspace, 'a-folder')).isDirectory()).toBe(true)
    expect(fs.existsSync(path.join(workspace, 'removed-link'))).toBe(false)
    expect(logged.filter((line) => line.includes('not brought back'))).toHaveLength(2)
    // the host's record holds links as links: the next push sends them as such
    expect(snapshotWorkspace(workspace).latest?.[2]).toBe('l')
  })

  it('never writes through a link the host has where the run made a folder', async () => {
    fs.symlinkSync(outside, path.join(workspace, 'planted'))
    fs.symlinkSync(path.join(outside, 'target'), path.join(workspace, 'file-link'))
    await apply(
      writeTar([
        {name: 'planted', type: '5', mode: 0o755, mtimeMs: 0, data: Buffer.alloc(0)},
        file('planted/x', 'pwned'),
        file('file-link', 'replaced'),
      ]),
      ['planted', 'planted/x', 'file-link'],
    )
    expect(fs.readdirSync(outside)).toEqual([])
    expect(fs.lstatSync(path.join(workspace, 'planted')).isSymbolicLink()).toBe(true)
    // the link itself is replaced by the file (rename over it), never written through
    expect(fs.lstatSync(path.join(workspace, 'file-link')).isFile()).toBe(true)
  })

  it('tells the run nothing of the host beyond a link: what exists there and what does not end the same way', async () => {
    // run 1 made `probe` a link to a host folder; run 2 has a real `probe/` with two names in it
    fs.mkdirSync(path.join(outside, '.ssh'))
    fs.writeFileSync(path.join(outside, '.ssh', 'id_ed25519'), 'secret')
    fs.symlinkSync(path.join(outside, '.ssh'), path.join(workspace, 'probe'))
    const synced = snapshotWorkspace(workspace)
    const {received, kept} = await apply(
      writeTar([
        {name: 'probe', type: '5', mode: 0o755, mtimeMs: 0, data: Buffer.alloc(0)},
        file('probe/id_ed25519', 'x'),
        file('probe/id_rsa', 'x'),
      ]),
      ['probe', 'probe/id_ed25519', 'probe/id_rsa'],
      synced,
    )
    expect([received, kept]).toEqual([0, []])
    expect(fs.readFileSync(path.join(outside, '.ssh', 'id_ed25519'), 'utf8')).toBe('secret')
    expect(fs.readdirSync(path.join(outside, '.ssh'))).toEqual(['id_ed25519'])
    const said = (name: string) => logged.find((line) => line.includes(`"probe/${name}"`))?.replaceAll(name, 'NAME')
    expect(said('id_ed25519')).toBeDefined()
    expect(said('id_ed25519')).toBe(said('id_rsa'))
  })

  it('never makes a link where the gateway keeps the agent’s own files, nor at the sync’s folder however it is spelled', async () => {
    fs.writeFileSync(path.join(workspace, 'memory.db'), '')
    fs.mkdirSync(path.join(workspace, 'skills'))
    const link = (name: string): TarInput => ({
      name,
      type: '2',
      mode: 0o777,
      mtimeMs: 0,
      data: Buffer.alloc(0),
      linkname: '/',
    })
    await apply(writeTar([link('memory.db'), link('SOUL.md'), link('\\.meepa-sync'), link('.\\.meepa-sync')]), [
      'memory.db',
      'skills',
      'SOUL.md',
    ])
    expect(fs.lstatSync(path.join(workspace, 'memory.db')).isFile()).toBe(true)
    expect(fs.existsSync(path.join(workspace, 'SOUL.md'))).toBe(false)
    expect(fs.existsSync(path.join(workspace, '.meepa-sync'))).toBe(false)
    expect(logged.filter((line) => line.includes('not brought back'))).toHaveLength(4)
  })

  it('refuses an entry over the size limit before reading it', () => {
    const big = writeTar([file('big', 'x'.repeat(4096))])
    expect(() => [...readTar(big, 1024)]).toThrow(/over the 1024 allowed/)
  })
})
