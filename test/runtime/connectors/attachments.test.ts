import fs from 'node:fs'
import os from 'node:os'
import path from 'node:path'
import {execFileSync} from 'node:child_process'
import {afterEach, describe, expect, it} from 'vitest'
import {
  receiveFiles,
  sanitiseContentType,
  sanitiseFileName,
  skippedFilesNote,
  type IncomingFile,
} from '../../../src/runtime/connectors/attachments.js'
import {DownloadRefused} from '../../../src/runtime/http/download.js'

const dirs: string[] = []
afterEach(() => {
  for (const dir of dirs.splice(0)) fs.rmSync(dir, {recursive: true, force: true})
})

function workspace(): {root: string; outside: string} {
  const base = fs.mkdtempSync(path.join(os.tmpdir(), 'inbox-'))
  dirs.push(base)
  const root = path.join(base, 'ws')
  const outside = path.join(base, 'outside')
  fs.mkdirSync(root)
  fs.mkdirSync(outside)
  return {root, outside}
}

function file(name: string, body: Buffer | string, extra: Partial<IncomingFile> = {}): IncomingFile {
  return {
    name,
    async *read() {
      yield Buffer.from(body)
    },
    ...extra,
  }
}

const CAPS = {fileBytes: 1024, files: 10, totalBytes: 4096}
/** The gateway's log, as receiveFiles writes to it. */
let logged: string[] = []
const log = (line: string) => logged.push(line)
afterEach(() => {
  logged = []
})

describe('receiving a message’s files into inbox/<message id>/', () => {
  it('sanitises names: no separators, leading dots, control or direction characters, bounded length', () => {
    expect(sanitiseFileName('../../etc/passwd')).toBe('_.._etc_passwd')
    expect(sanitiseFileName('..')).toBe('file')
    expect(sanitiseFileName('.env')).toBe('env')
    expect(sanitiseFileName('a\\b\u0000c\nd\u202egpj.exe')).toBe('a_b_c_d_gpj.exe')
    const long = sanitiseFileName(`${'é'.repeat(200)}.tar.gz`)
    expect(Buffer.byteLength(long)).toBeLessThanOrEqual(120)
    expect(long.endsWith('.gz')).toBe(true)
    expect(sanitiseContentType('IMAGE/PNG; charset=x')).toBe('image/png')
    expect(sanitiseContentType('text/html\r\nX-Evil: 1')).toBe('application/octet-stream')
    expect(sanitiseContentType(undefined)).toBe('application/octet-stream')
  })

  it('gives a colliding name a suffix and never writes through a planted link, FIFO or hardlink', async () => {
    const {root, outside} = workspace()
    const inbox = path.join(root, 'inbox', 'm1')
    fs.mkdirSync(inbox, {recursive: true})
    fs.writeFileSync(path.join(outside, 'target'), 'untouched')
    fs.symlinkSync(path.join(outside, 'target'), path.join(inbox, 'a.txt'))
    execFileSync('mkfifo', [path.join(inbox, 'b.txt')])
    fs.linkSync(path.join(outside, 'target'), path.join(inbox, 'c.txt'))
    const received = await receiveFiles(
      [file('a.txt', 'A'), file('b.txt', 'B'), file('c.txt', 'C'), file('a.txt', 'A2')],
      {workspace: root, messageId: 'm1', caps: CAPS, log},
    )
    expect(received.map((entry) => entry.path)).toEqual([
      'inbox/m1/a-2.txt',
      'inbox/m1/b-2.txt',
      'inbox/m1/c-2.txt',
      'inbox/m1/a-3.txt',
    ])
    expect(fs.readFileSync(path.join(outside, 'target'), 'utf8')).toBe('untouched')
    expect(fs.readFileSync(path.join(inbox, 'a-3.txt'), 'utf8')).toBe('A2')
    expect(fs.readdirSync(inbox).filter((name) => name.startsWith('.'))).toEqual([])
  })

  it('refuses a symlinked inbox or message directory: nothing lands outside the workspace', async () => {
    for (const planted of ['inbox', 'inbox/m1']) {
      const {root, outside} = workspace()
      fs.mkdirSync(path.dirname(path.join(root, planted)), {recursive: true})
      fs.symlinkSync(outside, path.join(root, planted))
      const [entry] = await receiveFiles([file('x.txt', 'X')], {workspace: root, messageId: 'm1', caps: CAPS, log})
      expect(entry?.path).toBeUndefined()
      expect(entry?.skipped).toBe("it could not be received (E_WORKSPACE; the gateway's log has the details)")
      expect(logged.at(-1)).toMatch(/^file "x\.txt" not received: ".*symbolic link/)
      expect(fs.readdirSync(outside)).toEqual([])
    }
  })

  it('applies every cap, keeps going after a skipped file, and leaves nothing of a cut stream', async () => {
    const {root} = workspace()
    const endless: IncomingFile = {
      name: 'endless',
      async *read() {
        for (;;) yield Buffer.alloc(512)
      },
    }
    const failing: IncomingFile = {
      name: 'gone',
      async *read() {
        yield Buffer.from('part')
        throw new DownloadRefused('http', 'the server answered HTTP 500', 500)
      },
    }
    const received = await receiveFiles(
      [
        file('declared.bin', '', {declaredSize: 5000}),
        endless,
        failing,
        file('one.bin', Buffer.alloc(1024)),
        file('two.bin', Buffer.alloc(1024)),
        file('three.bin', Buffer.alloc(1024)),
        file('four.bin', Buffer.alloc(1024)),
        file('scope', '', {unavailable: 'the Slack app lacks the files:read scope'}),
        file('ninth', 'x'),
        file('tenth', 'x'),
        file('eleventh', 'x'),
      ],
      {workspace: root, messageId: 'm2', caps: CAPS, log},
    )
    const why = Object.fromEntries(received.map((entry) => [entry.name, entry.skipped ?? entry.path]))
    expect(why).toEqual({
      'declared.bin': 'it is larger than the limit per file (1 KB, attachments.max_file_size)',
      endless: 'it is larger than the limit per file (1 KB, attachments.max_file_size)',
      gone: 'it could not be downloaded: the server answered HTTP 500',
      'one.bin': 'inbox/m2/one.bin',
      'two.bin': 'inbox/m2/two.bin',
      'three.bin': 'inbox/m2/three.bin',
      'four.bin': 'inbox/m2/four.bin',
      scope: 'the Slack app lacks the files:read scope',
      ninth: 'it would take the message past the limit for all files of a message (4 KB, attachments.max_total_size)',
      tenth: 'it would take the message past the limit for all files of a message (4 KB, attachments.max_total_size)',
      eleventh: 'a message may carry 10 file(s) (attachments.max_files)',
    })
    expect(fs.readdirSync(path.join(root, 'inbox/m2')).sort()).toEqual(['four.bin', 'one.bin', 'three.bin', 'two.bin'])
  })

  it('tells the sender the error code only: host paths and error texts go to the gateway log', async () => {
    const {root} = workspace()
    const missing = path.join(root, 'gone')
    const full: IncomingFile = {
      name: 'full.bin',
      async *read() {
        yield Buffer.from('part')
        throw Object.assign(new Error(`ENOSPC: no space left on device, write '${root}/inbox/m4/x'`), {code: 'ENOSPC'})
      },
    }
    const [gone] = await receiveFiles([file('a.txt', 'A')], {workspace: missing, messageId: 'm4', caps: CAPS, log})
    const [nospace] = await receiveFiles([full], {workspace: root, messageId: 'm4', caps: CAPS, log})
    expect(gone?.skipped).toBe("it could not be received (E_WORKSPACE; the gateway's log has the details)")
    expect(nospace?.skipped).toBe("it could not be received (ENOSPC; the gateway's log has the details)")
    const note = skippedFilesNote([gone!, nospace!])
    expect(note).not.toContain(root)
    expect(note).toBe(
      "(a.txt was not received: it could not be received (E_WORKSPACE; the gateway's log has the details).)\n" +
        "(full.bin was not received: it could not be received (ENOSPC; the gateway's log has the details).)",
    )
    expect(logged).toEqual([
      `file "a.txt" not received: ${JSON.stringify(`the workspace ${missing} does not exist`)}`,
      `file "full.bin" not received: ${JSON.stringify(`ENOSPC: no space left on device, write '${root}/inbox/m4/x'`)}`,
    ])
  })

  it('takes no more than the room limits.disk leaves: a file past it is skipped with the disk reason, the others arrive', async () => {
    const {root} = workspace()
    const full = "there is no room for it under the agent's disk limit"
    const caps = {fileBytes: 64 * 1024, files: 10, totalBytes: 256 * 1024}
    const endless: IncomingFile = {
      name: 'endless',
      async *read() {
        for (;;) yield Buffer.alloc(1024)
      },
    }
    // 28 KiB left: 8 KiB for inbox/ and inbox/m4/, 8 KiB for small.bin, 12 KiB for what follows
    const received = await receiveFiles(
      [
        file('small.bin', Buffer.alloc(5000)),
        file('declared.bin', '', {declaredSize: 13 * 1024}),
        endless,
        file('fits.bin', Buffer.alloc(12 * 1024)),
        file('after.bin', 'x'),
      ],
      {workspace: root, messageId: 'm4', caps, disk: {bytes: 28 * 1024, full}, log},
    )
    const why = Object.fromEntries(received.map((entry) => [entry.name, entry.skipped ?? entry.path]))
    expect(why).toEqual({
      'small.bin': 'inbox/m4/small.bin',
      'declared.bin': full,
      endless: full,
      'fits.bin': 'inbox/m4/fits.bin',
      'after.bin': full,
    })
    expect(fs.readdirSync(path.join(root, 'inbox/m4')).sort()).toEqual(['fits.bin', 'small.bin'])
    // no room at all: nothing is read, no folder is made
    let read = false
    const none = await receiveFiles([{name: 'x', read: () => ((read = true), file('x', 'x').read({maxBytes: 1}))}], {
      workspace: root,
      messageId: 'm5',
      caps,
      disk: {bytes: -100, full},
      log,
    })
    expect([none[0]?.skipped, read, fs.existsSync(path.join(root, 'inbox/m5'))]).toEqual([full, false, false])
  })

  it.skipIf(process.getuid?.() !== 0)('gives the files to the workspace owner (a container’s uid)', async () => {
    const {root} = workspace()
    fs.chownSync(root, 4321, 4321)
    const [entry] = await receiveFiles([file('x.txt', 'X')], {workspace: root, messageId: 'm3', caps: CAPS, log})
    for (const made of ['inbox', 'inbox/m3', entry!.path!])
      expect(fs.lstatSync(path.join(root, made)), made).toMatchObject({uid: 4321, gid: 4321})
  })
})
