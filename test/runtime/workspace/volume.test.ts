import {execa} from 'execa'
import {spawn} from 'node:child_process'
import fs from 'node:fs'
import path from 'node:path'
import os from 'node:os'
import {afterAll, afterEach, beforeAll, describe, expect, it} from 'vitest'
import {
  ensureWorkspaceVolume,
  mountedAt,
  volumeImagePath,
  volumeUnavailable,
} from '../../../src/runtime/workspace/volume.js'
import {diskUsage, heldByDeletedFiles} from '../../../src/runtime/run-lifecycle/disk-limit.js'
import {withHomeLock} from '../../../src/runtime/workspace/agent-lock.js'
import {makeHome, usedBytes, type TestHome} from '../../helpers/home.js'

/*
 * Issue 27 criterion 2: under a root gateway limits.disk is a filesystem of its own per workspace
 * (src/runtime/workspace/volume.ts). Real loop mounts; every home is unmounted by its cleanup.
 */

const MiB = 1024 ** 2
const homes: TestHome[] = []
afterEach(() => {
  for (const home of homes.splice(0)) home.cleanup()
})

/*
 * Every sandboxed run of a test beside these copies the mounts into its namespace (bubblewrap's
 * --ro-bind / /), and a copy holds a volume's loop device until that run ends. The homes here
 * live under an unbindable mount, which those copies leave out, so a volume is held elsewhere
 * only when a test holds it on purpose.
 */
let unbindable: string | undefined
beforeAll(async () => {
  if (volumeUnavailable() !== undefined) return
  unbindable = fs.mkdtempSync(path.join(os.tmpdir(), 'meepa-volumes-'))
  await execa('mount', ['--bind', unbindable, unbindable])
  await execa('mount', ['--make-unbindable', unbindable])
})
afterAll(async () => {
  if (unbindable === undefined) return
  await execa('umount', ['--recursive', unbindable])
  fs.rmSync(unbindable, {recursive: true, force: true})
})

function newHome(): TestHome {
  const home = makeHome(undefined, unbindable)
  homes.push(home)
  return home
}

/** Writes `mib` MiB of zeros to `file` as root; returns dd's exit code and what it said. */
async function writeZeros(file: string, mib: number): Promise<{exitCode?: number; said: string}> {
  const result = await execa('dd', ['if=/dev/zero', `of=${file}`, 'bs=1M', `count=${mib}`], {reject: false})
  return {exitCode: result.exitCode, said: result.stderr}
}

describe.runIf(volumeUnavailable() === undefined)('workspace volumes (limits.disk held by the kernel)', () => {
  it('the workspace is a filesystem of exactly the limit: even root cannot write past it', async () => {
    const home = newHome()
    await ensureWorkspaceVolume(home.home, 'a1', 8 * MiB)
    const workspace = home.workspace('a1')
    expect(mountedAt(workspace)?.fstype).toBe('ext4')
    expect(fs.statSync(volumeImagePath(home.home, 'a1')).size).toBe(8 * MiB)
    const written = await writeZeros(path.join(workspace, 'big'), 40)
    expect(written.said).toContain('No space left on device')
    expect(usedBytes(workspace)).toBeLessThanOrEqual(8 * MiB)
    // mounted nosuid,nodev: a set-user-ID file made there gives no rights
    expect(fs.readFileSync('/proc/self/mountinfo', 'utf8')).toMatch(
      new RegExp(`${workspace} [^ ]*(nosuid[^ ]*nodev|nodev[^ ]*nosuid)`),
    )
    // a second call finds it mounted and leaves it be
    await ensureWorkspaceVolume(home.home, 'a1', 8 * MiB)
    expect(fs.statSync(path.join(workspace, 'big')).size).toBeGreaterThan(6 * MiB)
  })

  // every message and standby checks its agent's volume: a ready one must not wait on (or write) a lock file
  it('a volume that is mounted and big enough is used at once, while another holds its lock', async () => {
    const home = newHome()
    await ensureWorkspaceVolume(home.home, 'a1', 8 * MiB)
    let release = () => {}
    let taken = () => {}
    const lockTaken = new Promise<void>((resolve) => (taken = resolve))
    const held = withHomeLock(home.home, 'volume-a1', 'a1', () => {
      taken()
      return new Promise<void>((resolve) => (release = resolve))
    })
    await lockTaken
    try {
      const waited = await Promise.race([
        ensureWorkspaceVolume(home.home, 'a1', 8 * MiB).then(() => false),
        new Promise((resolve) => setTimeout(() => resolve(true), 3000)),
      ])
      expect(waited).toBe(false)
    } finally {
      release()
      await held
    }
    // a grown limit still takes the lock and grows it
    await ensureWorkspaceVolume(home.home, 'a1', 16 * MiB)
    expect(fs.statSync(volumeImagePath(home.home, 'a1')).size).toBe(16 * MiB)
  })

  it("an existing workspace's files move in whole (hard links, modes, owners); files that do not fit leave it as it was", async () => {
    const home = newHome()
    const workspace = home.workspace('a1')
    fs.mkdirSync(path.join(workspace, 'deep', 'er'), {recursive: true})
    fs.writeFileSync(path.join(workspace, 'deep', 'er', 'note'), 'kept')
    fs.linkSync(path.join(workspace, 'deep', 'er', 'note'), path.join(workspace, 'link'))
    fs.chownSync(path.join(workspace, 'link'), 65534, 65534)
    fs.chownSync(workspace, 65534, 65534)
    fs.chmodSync(workspace, 0o700)
    await ensureWorkspaceVolume(home.home, 'a1', 8 * MiB)
    expect(mountedAt(workspace)).toBeDefined()
    const note = fs.statSync(path.join(workspace, 'deep', 'er', 'note'))
    expect(fs.readFileSync(path.join(workspace, 'link'), 'utf8')).toBe('kept')
    expect(note.nlink).toBe(2)
    expect(note.uid).toBe(65534)
    expect(fs.statSync(workspace)).toMatchObject({uid: 65534, mode: expect.any(Number)})
    expect(fs.statSync(workspace).mode & 0o777).toBe(0o700)
    expect(fs.readdirSync(workspace).sort()).toEqual(['deep', 'link'])
    expect(fs.existsSync(`${workspace}.moved`)).toBe(false)

    const full = newHome()
    const crowded = full.workspace('a2')
    fs.mkdirSync(crowded, {recursive: true})
    fs.writeFileSync(path.join(crowded, 'big'), Buffer.alloc(12 * MiB, 1))
    await expect(ensureWorkspaceVolume(full.home, 'a2', 8 * MiB)).rejects.toMatchObject({
      code: 'E_DISK',
      message: expect.stringContaining('do not fit its limits.disk'),
    })
    expect(mountedAt(crowded)).toBeUndefined()
    expect(fs.statSync(path.join(crowded, 'big')).size).toBe(12 * MiB)
    expect(fs.existsSync(volumeImagePath(full.home, 'a2'))).toBe(false)
    expect(fs.existsSync(`${crowded}.moving`)).toBe(false)
  })

  it('after an unmount (a reboot) it is mounted again; files in the bare directory are refused, never hidden', async () => {
    const home = newHome()
    const workspace = home.workspace('a1')
    await ensureWorkspaceVolume(home.home, 'a1', 8 * MiB)
    fs.writeFileSync(path.join(workspace, 'mine'), 'in the volume')
    await execa('umount', [workspace])
    fs.writeFileSync(path.join(workspace, 'stray'), 'written while unmounted')
    await expect(ensureWorkspaceVolume(home.home, 'a1', 8 * MiB)).rejects.toMatchObject({
      code: 'E_DISK',
      message: expect.stringContaining('holds files (stray) while its volume'),
    })
    expect(mountedAt(workspace)).toBeUndefined()
    expect(fs.readFileSync(path.join(workspace, 'stray'), 'utf8')).toBe('written while unmounted')
    fs.rmSync(path.join(workspace, 'stray'))
    await ensureWorkspaceVolume(home.home, 'a1', 8 * MiB)
    expect(fs.readFileSync(path.join(workspace, 'mine'), 'utf8')).toBe('in the volume')
  })

  it('a raised limit grows the mounted volume; a lowered one shrinks it at the next mount when the files fit', async () => {
    const home = newHome()
    const workspace = home.workspace('a1')
    await ensureWorkspaceVolume(home.home, 'a1', 8 * MiB)
    fs.writeFileSync(path.join(workspace, 'kept'), 'still here')
    await ensureWorkspaceVolume(home.home, 'a1', 32 * MiB)
    expect(fs.statfsSync(workspace).blocks * fs.statfsSync(workspace).bsize).toBeGreaterThan(24 * MiB)
    expect((await writeZeros(path.join(workspace, 'grown'), 20)).exitCode).toBe(0)
    fs.rmSync(path.join(workspace, 'grown'))
    await execa('umount', [workspace])
    await ensureWorkspaceVolume(home.home, 'a1', 8 * MiB)
    expect(fs.statSync(volumeImagePath(home.home, 'a1')).size).toBe(8 * MiB)
    expect(fs.readFileSync(path.join(workspace, 'kept'), 'utf8')).toBe('still here')
    expect((await writeZeros(path.join(workspace, 'big'), 20)).said).toContain('No space left on device')
  })

  it('a raised limit waits while another namespace holds the volume: never looser, grown at the next mount', async () => {
    const home = newHome()
    const workspace = home.workspace('a1')
    await ensureWorkspaceVolume(home.home, 'a1', 8 * MiB)
    // a namespace made now keeps a copy of the mount, as a standby's does
    const holder = spawn('unshare', ['--mount', 'sleep', '60'], {stdio: 'ignore'})
    try {
      await new Promise((resolve) => setTimeout(resolve, 200))
      await ensureWorkspaceVolume(home.home, 'a1', 32 * MiB)
      expect(fs.statfsSync(workspace).blocks * fs.statfsSync(workspace).bsize).toBeLessThan(8 * MiB)
      expect((await writeZeros(path.join(workspace, 'big'), 20)).said).toContain('No space left on device')
      fs.rmSync(path.join(workspace, 'big'))
    } finally {
      holder.kill('SIGKILL')
    }
    await new Promise((resolve) => holder.once('exit', resolve))
    await execa('umount', [workspace])
    await ensureWorkspaceVolume(home.home, 'a1', 32 * MiB)
    expect(fs.statfsSync(workspace).blocks * fs.statfsSync(workspace).bsize).toBeGreaterThan(24 * MiB)
  })

  it('a move cut short by a crash is undone: the files back in place, no half-filled volume', async () => {
    const home = newHome()
    const workspace = home.workspace('a1')
    fs.mkdirSync(`${workspace}.moving`, {recursive: true})
    fs.writeFileSync(path.join(`${workspace}.moving`, 'note'), 'original')
    fs.mkdirSync(workspace)
    fs.mkdirSync(path.dirname(volumeImagePath(home.home, 'a1')), {recursive: true})
    fs.writeFileSync(volumeImagePath(home.home, 'a1'), 'half made')
    await ensureWorkspaceVolume(home.home, 'a1', 8 * MiB)
    expect(fs.readFileSync(path.join(workspace, 'note'), 'utf8')).toBe('original')
    expect(mountedAt(workspace)).toBeDefined()
    expect(fs.existsSync(`${workspace}.moving`)).toBe(false)
  })

  it("limits.disk's measurement reads a volume's own count: below any depth, unlinked open files once, without a walk", async () => {
    const home = newHome()
    const workspace = home.workspace('a1')
    await ensureWorkspaceVolume(home.home, 'a1', 16 * MiB)
    // 4 MiB below a path past PATH_MAX (30 directories of 200 characters)
    const deep = `import os
os.chdir(${JSON.stringify(workspace)})
for i in range(30):
    os.mkdir("x" * 200); os.chdir("x" * 200)
open("big", "wb").write(bytes(4 << 20))`
    await execa('python3', ['-c', deep])
    const hold = `import os, sys; f = open(sys.argv[1], "wb"); f.write(bytes(3 << 20)); f.flush(); os.unlink(sys.argv[1]); print("ready", flush=True); sys.stdin.read()`
    const held = spawn('python3', ['-c', hold, path.join(workspace, 'held')], {stdio: ['pipe', 'pipe', 'inherit']})
    try {
      await new Promise((resolve) => held.stdout.once('data', resolve))
      const usage = await diskUsage([workspace], 16 * MiB)
      expect(usage.error).toBeUndefined()
      expect(usage.bytes).toBeGreaterThan(7 * MiB)
      expect(usage.bytes).toBeLessThan(9 * MiB)
      // the unlinked file is in the volume's count already: not counted twice
      expect(await heldByDeletedFiles([held.pid as number], [workspace])).toBe(0)
      expect(await heldByDeletedFiles([held.pid as number])).toBeGreaterThanOrEqual(3 * MiB)
    } finally {
      held.stdin.end()
      await new Promise((resolve) => held.once('exit', resolve))
    }
  })

  it("an image still mounted in another mount namespace (a standby's) is never checked or shrunk from here", async () => {
    const home = newHome()
    const workspace = home.workspace('a1')
    await ensureWorkspaceVolume(home.home, 'a1', 16 * MiB)
    // a namespace of its own holding a copy of the mount, as bubblewrap's does
    const holder = spawn('unshare', ['-m', '--propagation', 'private', 'sh', '-c', 'echo ready; read line'], {
      stdio: ['pipe', 'pipe', 'inherit'],
    })
    try {
      await new Promise((resolve) => holder.stdout.once('data', resolve))
      await execa('umount', [workspace])
      await ensureWorkspaceVolume(home.home, 'a1', 8 * MiB)
      expect(fs.statSync(volumeImagePath(home.home, 'a1')).size).toBe(16 * MiB)
      expect(mountedAt(workspace)).toBeDefined()
    } finally {
      holder.stdin.end()
      await new Promise((resolve) => holder.once('exit', resolve))
    }
  })
})
