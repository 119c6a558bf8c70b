import {execFileSync} from 'node:child_process'
import fs from 'node:fs'
import os from 'node:os'
import path from 'node:path'
import {afterEach, beforeEach, describe, expect, it, vi} from 'vitest'
import {readFilesToSend} from '../../../src/runtime/workspace/files-to-send.js'

const CAPS = {max_file_size: '1k', max_files: 3, max_total_size: '2k', inbox_retention_days: 7}
let base: string
let workspace: string
let outside: string

beforeEach(() => {
  base = fs.mkdtempSync(path.join(os.tmpdir(), 'files-to-send-'))
  workspace = path.join(base, 'ws')
  outside = path.join(base, 'outside')
  fs.mkdirSync(workspace)
  fs.mkdirSync(outside)
  fs.writeFileSync(path.join(outside, 'secret.txt'), 'the operator secret')
})
afterEach(() => {
  vi.restoreAllMocks()
  fs.rmSync(base, {recursive: true, force: true})
})

const send = (...paths: string[]) =>
  readFilesToSend(
    workspace,
    paths.map((file) => ({path: file})),
    CAPS,
  )

describe('the gateway reads the files an agent asked to send (hostile workspace)', () => {
  it('reads regular files below the workspace, with name, size and type', () => {
    fs.mkdirSync(path.join(workspace, 'out'))
    fs.writeFileSync(path.join(workspace, 'out', 'plot.png'), 'png-bytes')
    fs.writeFileSync(path.join(workspace, 'notes'), 'plain')
    const {files, refused} = send('out/plot.png', './notes')
    expect(refused).toEqual([])
    expect(files.map(({name, size, content_type, data}) => [name, size, content_type, data.toString()])).toEqual([
      ['plot.png', 9, 'image/png', 'png-bytes'],
      ['notes', 5, 'application/octet-stream', 'plain'],
    ])
  })

  it('refuses a symbolic link at the file, and one at a parent folder, without reading what they point to', () => {
    fs.symlinkSync(path.join(outside, 'secret.txt'), path.join(workspace, 'link.txt'))
    fs.symlinkSync(outside, path.join(workspace, 'dir'))
    const {files, refused} = send('link.txt', 'dir/secret.txt')
    expect(files).toEqual([])
    expect(refused).toEqual([
      {name: 'link.txt', reason: 'it is a symbolic link'},
      {name: 'secret.txt', reason: 'a folder on its path is a symbolic link'},
    ])
  })

  it('refuses a FIFO without blocking on it', () => {
    execFileSync('mkfifo', [path.join(workspace, 'pipe')])
    const started = Date.now()
    expect(send('pipe')).toEqual({files: [], refused: [{name: 'pipe', reason: 'it is a FIFO'}]})
    expect(Date.now() - started).toBeLessThan(1000)
  })

  it('refuses a hard link (it may name a file from outside the workspace)', () => {
    fs.linkSync(path.join(outside, 'secret.txt'), path.join(workspace, 'hard.txt'))
    const {files, refused} = send('hard.txt')
    expect(files).toEqual([])
    expect(refused[0]?.reason).toMatch(/other hard link\(s\) and may be a file from outside the workspace/)
  })

  it('refuses paths with .., absolute paths, and a missing file', () => {
    fs.writeFileSync(path.join(workspace, 'ok.txt'), 'x')
    const {files, refused} = send('../outside/secret.txt', path.join(outside, 'secret.txt'), 'missing.txt')
    expect(files).toEqual([])
    expect(refused.map((refusal) => refusal.reason)).toEqual([
      'it is not a path inside the workspace',
      'it is not a path inside the workspace',
      'it does not exist',
    ])
  })

  it('refuses a directory and a file over the size cap, and sends the rest', () => {
    fs.mkdirSync(path.join(workspace, 'folder'))
    fs.writeFileSync(path.join(workspace, 'big.bin'), Buffer.alloc(1025))
    fs.writeFileSync(path.join(workspace, 'small.txt'), 'fine')
    const {files, refused} = send('folder', 'big.bin', 'small.txt')
    expect(files.map((file) => file.name)).toEqual(['small.txt'])
    expect(refused).toEqual([
      {name: 'folder', reason: 'it is a directory'},
      {name: 'big.bin', reason: 'it is 1025 bytes, over the limit of 1024 (attachments.max_file_size: 1k)'},
    ])
  })

  it('keeps to the count cap, in the order asked', () => {
    for (const name of ['a', 'b', 'c', 'd']) fs.writeFileSync(path.join(workspace, name), Buffer.alloc(100))
    const {files, refused} = send('a', 'b', 'c', 'd')
    expect(files.map((file) => file.name)).toEqual(['a', 'b', 'c'])
    expect(refused).toEqual([{name: 'd', reason: 'over the limit of 3 files per message (attachments.max_files)'}])
  })

  it('keeps to the total cap: a file that would pass it is refused, a smaller one after it still goes', () => {
    for (const name of ['a', 'b', 'c']) fs.writeFileSync(path.join(workspace, name), Buffer.alloc(800))
    fs.writeFileSync(path.join(workspace, 'tiny'), Buffer.alloc(10))
    const {files, refused} = send('a', 'b', 'c', 'tiny')
    expect(files.map((file) => file.name)).toEqual(['a', 'b', 'tiny'])
    expect(refused).toEqual([
      {name: 'c', reason: 'the files of this message would exceed attachments.max_total_size (2k)'},
    ])
  })

  it('reads once with a bound: a file grown past the cap after its size was taken is refused', () => {
    fs.writeFileSync(path.join(workspace, 'growing.log'), Buffer.alloc(5000, 'x'))
    fs.writeFileSync(path.join(workspace, 'grew-a-little.log'), Buffer.alloc(900, 'y'))
    const realFstat = fs.fstatSync
    // the agent appends between the gateway's fstat and its reads: the size it saw is stale
    vi.spyOn(fs, 'fstatSync').mockImplementation(((fd: number) => {
      const stat = realFstat(fd)
      return Object.assign(Object.create(Object.getPrototypeOf(stat)), stat, {size: 10})
    }) as typeof fs.fstatSync)
    const {files, refused} = send('growing.log', 'grew-a-little.log')
    expect(refused).toEqual([
      {
        name: 'growing.log',
        reason: 'it grew past the limit of 1024 bytes while being read (attachments.max_file_size: 1k)',
      },
    ])
    expect(files.map((file) => [file.name, file.size])).toEqual([['grew-a-little.log', 900]])
  })

  it('names what it sends without control characters or directories', () => {
    fs.writeFileSync(path.join(workspace, 'evil\u202etxt.exe\n'), 'x')
    const {files} = send('evil\u202etxt.exe\n')
    expect(files[0]?.name).toBe('eviltxt.exe')
  })
})
