import {execFileSync, spawn} from 'node:child_process'
import fs from 'node:fs'
import os from 'node:os'
import path from 'node:path'
import {afterEach, beforeEach, describe, expect, it} from 'vitest'
import {ensureWorkspace} from '../../../src/runtime/workspace/workspace.js'
import {readWorkspaceFile, writeWorkspaceFile} from '../../../src/runtime/workspace/files.js'
import {PASSWORD, sessionHeaders, startCaptain, type CaptainHarness} from './helpers.js'

const isRoot = process.getuid?.() === 0

/** What a sandboxed agent can plant in its own workspace, each in place of `name`. */
function plant(
  workspace: string,
  kind: 'environ symlink' | 'fifo' | 'device' | 'dangling symlink',
  name = 'SOUL.md',
): void {
  const file = path.join(workspace, name)
  fs.rmSync(file, {force: true})
  if (kind === 'environ symlink') fs.symlinkSync('/proc/self/environ', file)
  if (kind === 'dangling symlink') fs.symlinkSync(path.join(os.tmpdir(), `meepa-nothing-${process.pid}`), file)
  if (kind === 'fifo') execFileSync('mkfifo', [file])
  if (kind === 'device') execFileSync('mknod', [file, 'c', '1', '3']) // /dev/null's numbers
}

describe('the gateway never follows what an agent planted in its workspace', () => {
  let workspace: string
  let outside: string
  beforeEach(() => {
    workspace = fs.mkdtempSync(path.join(os.tmpdir(), 'meepa-ws-'))
    outside = fs.mkdtempSync(path.join(os.tmpdir(), 'meepa-outside-'))
    fs.writeFileSync(path.join(outside, 'secret.txt'), 'OPERATOR SECRET')
  })
  afterEach(() => {
    fs.rmSync(workspace, {recursive: true, force: true})
    fs.rmSync(outside, {recursive: true, force: true})
  })

  it('refuses a symlink to /proc/self/environ without reading through it', () => {
    plant(workspace, 'environ symlink')
    expect(() => readWorkspaceFile(workspace, 'SOUL.md')).toThrow(/SOUL\.md is a symbolic link/)
  })

  it('refuses a FIFO at once instead of hanging on it', () => {
    plant(workspace, 'fifo')
    const started = Date.now()
    expect(() => readWorkspaceFile(workspace, 'SOUL.md')).toThrow(/is a FIFO/)
    expect(Date.now() - started).toBeLessThan(1000)
  })

  it.runIf(isRoot)('refuses a device node (mknod, as root)', () => {
    plant(workspace, 'device')
    expect(() => readWorkspaceFile(workspace, 'SOUL.md')).toThrow(/is a device node/)
  })

  it('refuses a hard link to a file outside the workspace (one left from a time the agent ran unrestricted)', () => {
    fs.linkSync(path.join(outside, 'secret.txt'), path.join(workspace, 'SOUL.md'))
    expect(fs.statSync(path.join(workspace, 'SOUL.md')).nlink).toBe(2)
    expect(() => readWorkspaceFile(workspace, 'SOUL.md')).toThrow(/SOUL\.md has 1 other hard link/)
    writeWorkspaceFile(workspace, 'SOUL.md', '# new soul\n') // replaces the name, never writes through it
    expect(fs.readFileSync(path.join(outside, 'secret.txt'), 'utf8')).toBe('OPERATOR SECRET')
    expect(readWorkspaceFile(workspace, 'SOUL.md')).toBe('# new soul\n')
  })

  it('refuses a file under a symlinked parent directory, for reading and for writing', () => {
    fs.symlinkSync(outside, path.join(workspace, 'skills'))
    expect(() => readWorkspaceFile(workspace, 'skills/secret.txt')).toThrow(/parent \(skills\) that is a symbolic link/)
    expect(() => writeWorkspaceFile(workspace, 'skills/secret.txt', 'overwritten')).toThrow(/symbolic link/)
    expect(fs.readFileSync(path.join(outside, 'secret.txt'), 'utf8')).toBe('OPERATOR SECRET')
  })

  it('writes replace a planted link with a regular file instead of writing through it', () => {
    fs.symlinkSync(path.join(outside, 'secret.txt'), path.join(workspace, 'SOUL.md'))
    writeWorkspaceFile(workspace, 'SOUL.md', '# new soul\n')
    expect(fs.lstatSync(path.join(workspace, 'SOUL.md')).isFile()).toBe(true)
    expect(fs.readFileSync(path.join(workspace, 'SOUL.md'), 'utf8')).toBe('# new soul\n')
    expect(fs.readFileSync(path.join(outside, 'secret.txt'), 'utf8')).toBe('OPERATOR SECRET')
    expect(fs.readdirSync(workspace)).toEqual(['SOUL.md']) // no temp file left
  })

  it('caps the size it reads, and reads regular files and missing ones normally', () => {
    fs.writeFileSync(path.join(workspace, 'MEMORY.md'), 'x'.repeat(2048))
    expect(() => readWorkspaceFile(workspace, 'MEMORY.md', {maxBytes: 1024})).toThrow(/larger than 1024 bytes/)
    expect(readWorkspaceFile(workspace, 'MEMORY.md')).toHaveLength(2048)
    expect(readWorkspaceFile(workspace, 'nothing.md')).toBeUndefined()
    expect(() => readWorkspaceFile(workspace, '../outside.md')).toThrow(/not a path inside the workspace/)
  })

  it('workspace creation keeps planted entries untouched and refuses a planted memory.db', () => {
    const home = fs.mkdtempSync(path.join(os.tmpdir(), 'meepa-home-'))
    try {
      const root = path.join(home, 'agents', 'a1')
      fs.mkdirSync(root, {recursive: true})
      fs.symlinkSync(path.join(outside, 'secret.txt'), path.join(root, 'SOUL.md'))
      plant(root, 'dangling symlink', 'MEMORY.md')
      const result = ensureWorkspace(home, 'a1')
      expect(result.kept).toEqual(expect.arrayContaining(['SOUL.md', 'MEMORY.md']))
      expect(fs.readFileSync(path.join(outside, 'secret.txt'), 'utf8')).toBe('OPERATOR SECRET')
      // not created through the link
      expect(fs.existsSync(path.join(os.tmpdir(), `meepa-nothing-${process.pid}`))).toBe(false)
      // memory.db pointing at the gateway's own database would have SQLite write into it
      fs.rmSync(path.join(root, 'memory.db'))
      fs.symlinkSync(path.join(home, 'gateway.db'), path.join(root, 'memory.db'))
      expect(() => ensureWorkspace(home, 'a1')).toThrow(/memory\.db is a symbolic link/)
      expect(fs.existsSync(path.join(home, 'gateway.db'))).toBe(false)
    } finally {
      fs.rmSync(home, {recursive: true, force: true})
    }
  })
})

/** The agent's side of a race: each time memory.db appears as a regular file, a link to `target` is renamed over it. */
const SWAPPER = `
const fs = require('fs'), path = require('path')
const [dir, target] = process.argv.slice(1)
let n = 0
fs.watch(dir, (event, name) => {
  if (name !== 'memory.db') return
  try {
    if (!fs.lstatSync(path.join(dir, name)).isFile()) return
    const link = path.join(dir, '.swap' + n++)
    fs.symlinkSync(target, link)
    fs.renameSync(link, path.join(dir, name))
  } catch {}
})
process.stdout.write('watching\\n')
`

describe('an agent racing the gateway while it creates memory.db', () => {
  it('gets no file created or written outside the workspace, however often it wins the swap', async () => {
    const home = fs.mkdtempSync(path.join(os.tmpdir(), 'meepa-home-'))
    const outside = fs.mkdtempSync(path.join(os.tmpdir(), 'meepa-outside-'))
    const target = path.join(outside, 'created-through-the-link.db')
    const workspace = ensureWorkspace(home, 'a1').path
    const swapper = spawn(process.execPath, ['-e', SWAPPER, workspace, target], {stdio: ['ignore', 'pipe', 'inherit']})
    try {
      await new Promise((resolve) => swapper.stdout.once('data', resolve))
      for (let attempt = 0; attempt < 40 && !fs.existsSync(target); attempt++) {
        // the agent deletes memory.db during its run; the operator then saves SOUL.md (ensureWorkspace)
        for (const name of fs.readdirSync(workspace))
          if (name.startsWith('memory.db') || name.startsWith('.swap'))
            fs.rmSync(path.join(workspace, name), {force: true})
        try {
          ensureWorkspace(home, 'a1')
        } catch {
          // a link that won the race is refused: what matters is what happened outside
        }
        await new Promise((resolve) => setTimeout(resolve, 10))
      }
      expect(fs.existsSync(target)).toBe(false)
    } finally {
      swapper.kill()
      fs.rmSync(home, {recursive: true, force: true})
      fs.rmSync(outside, {recursive: true, force: true})
    }
  })
})

describe('the dashboard SOUL.md page with planted files', () => {
  let harness: CaptainHarness | undefined
  afterEach(async () => {
    await harness?.close()
    harness = undefined
  })

  it('answers a clear error for each planted kind, never the environment, and Save replaces the link', async () => {
    harness = await startCaptain({env: {PLANTED_SECRET: 'sk-live-never-shown'}})
    process.env.PLANTED_SECRET = 'sk-live-never-shown'
    try {
      const headers = sessionHeaders(await harness.login())
      const workspace = harness.home.workspace('meepa')
      ensureWorkspace(harness.home.home, 'meepa')
      for (const kind of ['environ symlink', 'fifo', ...(isRoot ? ['device' as const] : [])] as const) {
        plant(workspace, kind)
        const res = await harness.request('GET', '/api/captain/agents/meepa/soul', {headers})
        expect(res.status, kind).toBe(409)
        expect(res.body.error.code).toBe('E_WORKSPACE')
        expect(JSON.stringify(res.body)).not.toContain('sk-live-never-shown')
        expect(JSON.stringify(res.body)).not.toContain(PASSWORD)
      }
      plant(workspace, 'environ symlink')
      const saved = await harness.request('PUT', '/api/captain/agents/meepa/soul', {
        body: {content: '# mine\n'},
        headers,
      })
      expect(saved.status).toBe(200)
      expect(fs.lstatSync(path.join(workspace, 'SOUL.md')).isFile()).toBe(true)
      expect((await harness.request('GET', '/api/captain/agents/meepa/soul', {headers})).body.content).toBe('# mine\n')
    } finally {
      delete process.env.PLANTED_SECRET
    }
  })
})
