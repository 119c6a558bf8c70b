import {execFileSync} from 'node:child_process'
import fs from 'node:fs'
import os from 'node:os'
import path from 'node:path'
import {afterEach, describe, expect, it} from 'vitest'
import {withAgentLock} from '../../../src/runtime/workspace/agent-lock.js'

/*
 * The per-agent lock file on a full disk: its creation succeeds (an inode is free) but writing the
 * owner's pid fails. That lock must not outlive the failure, or every later run of the agent waits
 * for an owner that never existed.
 */
const root = process.getuid?.() === 0
if (!root) process.stderr.write('\n!!! SKIPPING agent-lock full-disk tests: mounting a tmpfs needs root\n\n')

const cleanups: Array<() => void> = []
afterEach(() => {
  for (const cleanup of cleanups.splice(0).reverse()) cleanup()
})

describe.runIf(root)('the agent lock on a full disk', () => {
  it('the run fails with ENOSPC, leaves no lock behind, and the next run takes the lock at once', async () => {
    const home = fs.mkdtempSync(path.join(os.tmpdir(), 'meepa-lock-'))
    cleanups.push(() => fs.rmSync(home, {recursive: true, force: true}))
    execFileSync('mount', ['-t', 'tmpfs', '-o', 'size=1m', 'tmpfs', home])
    cleanups.push(() => execFileSync('umount', ['-l', home]))
    fs.mkdirSync(path.join(home, 'locks'))
    const filler = path.join(home, 'filler')
    execFileSync('sh', ['-c', `dd if=/dev/zero of=${filler} bs=4k 2>/dev/null || true`])

    await expect(withAgentLock(home, 'meepa', async () => 'ran')).rejects.toMatchObject({code: 'ENOSPC'})
    expect(fs.readdirSync(path.join(home, 'locks'))).toEqual([])

    fs.rmSync(filler)
    const started = Date.now()
    expect(await withAgentLock(home, 'meepa', async () => 'ran', {waitMs: 2_000})).toBe('ran')
    expect(Date.now() - started).toBeLessThan(1_000)
  })
})
