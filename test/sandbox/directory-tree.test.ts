import {execa} from 'execa'
import fs from 'node:fs'
import os from 'node:os'
import path from 'node:path'
import {ChildProcess} from 'node:child_process'
import {afterEach, describe, expect, it, vi} from 'vitest'
import {measureTrees, removeTrees} from '../../src/sandbox/directory-tree.js'
import {HELPER} from '../helpers/landlock-support.js'

/*
 * Issue 27 criteria 2 and 3: the helper's descriptor-relative walks (meepa-sandbox --measure and
 * --remove), which limits.disk, TMPDIR removal, the start-up reaper and the keeper rely on. Trees
 * are built as an agent would leave them: past PATH_MAX, wide, hard-linked, sparse, preallocated,
 * with symlinks out and directories it locked.
 */

const MiB = 1024 * 1024
const dirs: string[] = []
const mounts: string[] = []
afterEach(async () => {
  for (const dir of mounts.splice(0)) await execa('umount', ['-l', dir], {reject: false})
  for (const dir of dirs.splice(0)) await removeTrees([dir]).catch(() => execa('rm', ['-rf', dir]))
})

function scratch(): string {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'tree-test-'))
  dirs.push(dir)
  return dir
}

/** Runs Python in `cwd`: it builds a tree with relative calls, as deep as it likes, in one process. */
async function python(cwd: string, code: string): Promise<void> {
  await execa('python3', ['-c', code], {cwd})
}

/**
 * `levels` nested directories named `name`, `perLevel` empty files in each; returns nothing (the
 * path would be too long to use).
 */
function deepTree(levels: number, perLevel: number, name = 'd'): string {
  return `import os
for i in range(${levels}):
    os.mkdir(${JSON.stringify(name)}); os.chdir(${JSON.stringify(name)})
    for j in range(${perLevel}): os.close(os.open("f%d" % j, os.O_CREAT | os.O_WRONLY, 0o644))`
}

const helperBuilt = process.platform === 'linux' && fs.existsSync(HELPER)
const root = process.getuid?.() === 0

describe.runIf(helperBuilt)("measuring a run's files (limits.disk)", {timeout: 60_000}, () => {
  it('counts files below a path longer than PATH_MAX (25 nested 200-character directories)', async () => {
    const dir = scratch()
    await python(
      dir,
      `import os
for i in range(25):
    os.mkdir("x" * 200); os.chdir("x" * 200)
for i in range(10):
    open("big%d" % i, "wb").write(b"\\1" * ${MiB})`,
    )
    const usage = await measureTrees([dir])
    expect(usage.error).toBeUndefined()
    expect(usage.bytes).toBeGreaterThanOrEqual(10 * MiB)
    expect(usage.bytes).toBeLessThan(11 * MiB)
  })

  it('counts every entry of a wide tree at least one 4 KiB block, and a deep one of 1000 levels', async () => {
    const wide = scratch()
    await python(wide, deepTree(1, 5000))
    expect((await measureTrees([wide])).bytes).toBeGreaterThanOrEqual(5001 * 4096)
    const deep = scratch()
    await python(deep, deepTree(1000, 1))
    expect(await measureTrees([deep])).toEqual({bytes: expect.any(Number)})
    expect((await measureTrees([deep])).bytes).toBeGreaterThanOrEqual(2000 * 4096)
  })

  it('counts a hard-linked file once, a sparse file by its allocated blocks and preallocated space in full', async () => {
    const dir = scratch()
    fs.writeFileSync(path.join(dir, 'data'), Buffer.alloc(4 * MiB, 1))
    for (let i = 0; i < 50; i++) fs.linkSync(path.join(dir, 'data'), path.join(dir, `link${i}`))
    const linked = (await measureTrees([dir])).bytes
    expect(linked).toBeGreaterThanOrEqual(4 * MiB)
    expect(linked).toBeLessThan(5 * MiB)

    const sparse = scratch()
    await execa('truncate', ['-s', '10G', path.join(sparse, 'hole')])
    expect((await measureTrees([sparse])).bytes).toBeLessThan(MiB)

    const reserved = scratch()
    await execa('fallocate', ['-l', '20M', path.join(reserved, 'grown')])
    // FALLOC_FL_KEEP_SIZE: blocks without a size (fallocate -n opens no new file)
    fs.writeFileSync(path.join(reserved, 'kept'), '')
    await execa('fallocate', ['-n', '-l', '20M', path.join(reserved, 'kept')])
    expect(fs.statSync(path.join(reserved, 'kept')).size).toBe(0)
    expect((await measureTrees([reserved])).bytes).toBeGreaterThanOrEqual(40 * MiB)
  })

  it('stops walking once past the limit it is given', async () => {
    const dir = scratch()
    await python(dir, deepTree(1, 2000))
    const usage = await measureTrees([dir], {stopAbove: MiB})
    expect(usage.bytes).toBeGreaterThan(MiB)
    expect(usage.bytes).toBeLessThan(MiB + 64 * 1024)
  })

  it('a root that is gone holds nothing (a TMPDIR a cleaner of /tmp removed); a root that is no directory is an error', async () => {
    const dir = scratch()
    expect(await measureTrees([path.join(dir, 'gone')])).toEqual({bytes: 0})
    fs.writeFileSync(path.join(dir, 'file'), 'x')
    expect((await measureTrees([path.join(dir, 'file')])).error).toMatch(/Not a directory/)
  })

  // a run's TMPDIR is most often empty (and in the host sandbox always, on the host): each message
  // measures it twice, and a process per measure held the gateway's event loop at every start
  it('an empty root, or one that is gone, is counted as nothing without starting the helper; any other root is walked', async () => {
    const dir = scratch()
    fs.mkdirSync(path.join(dir, 'empty'))
    fs.mkdirSync(path.join(dir, 'full'))
    fs.writeFileSync(path.join(dir, 'full', 'f'), 'x')
    fs.symlinkSync(path.join(dir, 'full'), path.join(dir, 'link'))
    const spawn = vi.spyOn(ChildProcess.prototype as unknown as {spawn(options: unknown): void}, 'spawn')
    try {
      expect(await measureTrees([path.join(dir, 'empty'), path.join(dir, 'gone')])).toEqual({bytes: 0})
      expect(spawn).not.toHaveBeenCalled()
      expect((await measureTrees([path.join(dir, 'empty'), path.join(dir, 'full')])).bytes).toBe(4096)
      expect(spawn).toHaveBeenCalledTimes(1)
      // a link is the helper's to judge, whatever it points at
      await measureTrees([path.join(dir, 'link')])
      expect(spawn).toHaveBeenCalledTimes(2)
    } finally {
      spawn.mockRestore()
    }
  })

  it.runIf(root && fs.existsSync('/usr/bin/setpriv'))(
    'a directory the run locked (mode 000, non-root gateway) is an error naming it',
    async () => {
      const dir = scratch()
      await python(
        dir,
        `import os
os.makedirs("a/locked"); open("a/locked/f", "w").write("x")
os.chmod("a/locked", 0)`,
      )
      await execa('chown', ['-R', '65534:65534', dir])
      const result = await execa(
        'setpriv',
        ['--reuid=65534', '--regid=65534', '--clear-groups', HELPER, '--measure', dir],
        {reject: false},
      )
      expect(result.exitCode).toBe(1)
      expect(result.stderr).toMatch(/cannot measure .*'locked' at depth 2: Permission denied/)
    },
  )
})

describe.runIf(helperBuilt)("removing a run's directory", {timeout: 120_000}, () => {
  it("removes a tree of 1000 levels with files at each, past PATH_MAX and past the helper's open-descriptor budget", async () => {
    const dir = scratch()
    await python(dir, deepTree(1000, 3, 'level'))
    await removeTrees([dir])
    expect(fs.existsSync(dir)).toBe(false)
  })

  it('removes a symlink or a file in its place, and never what a symlink in it points at', async () => {
    const dir = scratch()
    const victim = path.join(dir, 'victim')
    fs.mkdirSync(victim)
    fs.writeFileSync(path.join(victim, 'keep'), 'operator data')
    const tree = path.join(dir, 'tree')
    fs.mkdirSync(path.join(tree, 'sub'), {recursive: true})
    fs.symlinkSync(victim, path.join(tree, 'sub', 'link'))
    fs.symlinkSync(victim, path.join(dir, 'root-link'))
    await removeTrees([tree, path.join(dir, 'root-link'), path.join(dir, 'never-was')])
    expect(fs.existsSync(tree)).toBe(false)
    expect(fs.existsSync(path.join(dir, 'root-link'))).toBe(false)
    expect(fs.readFileSync(path.join(victim, 'keep'), 'utf8')).toBe('operator data')
  })

  it.runIf(root)('does not remove another filesystem mounted inside; says what was left', async () => {
    const dir = scratch()
    const mount = path.join(dir, 'tree', 'sub', 'mnt')
    fs.mkdirSync(mount, {recursive: true})
    fs.writeFileSync(path.join(dir, 'tree', 'other'), 'x')
    await execa('mount', ['-t', 'tmpfs', 'tmpfs', mount])
    mounts.push(mount)
    fs.writeFileSync(path.join(mount, 'mounted'), 'kept')
    await expect(removeTrees([path.join(dir, 'tree')])).rejects.toThrow(
      /not removing another filesystem mounted at 'mnt' at depth 2/,
    )
    expect(fs.readFileSync(path.join(mount, 'mounted'), 'utf8')).toBe('kept')
    expect(fs.existsSync(path.join(dir, 'tree', 'other'))).toBe(false)
  })

  it.runIf(root && fs.existsSync('/usr/bin/setpriv'))(
    'as a non-root owner, removes directories the run made unreadable or read-only',
    async () => {
      const dir = scratch()
      await python(
        dir,
        `import os
os.makedirs("tree/locked/inner"); open("tree/locked/inner/f", "w").write("x")
os.makedirs("tree/readonly"); open("tree/readonly/f", "w").write("x")
os.chmod("tree/locked/inner", 0); os.chmod("tree/locked", 0); os.chmod("tree/readonly", 0o500)`,
      )
      await execa('chown', ['-R', '65534:65534', dir])
      const result = await execa(
        'setpriv',
        ['--reuid=65534', '--regid=65534', '--clear-groups', HELPER, '--remove', path.join(dir, 'tree')],
        {reject: false},
      )
      expect(result.stderr).toBe('')
      expect(result.exitCode).toBe(0)
      expect(fs.existsSync(path.join(dir, 'tree'))).toBe(false)
    },
  )
})
