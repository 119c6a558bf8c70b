import {execa, execaSync} from 'execa'
import crypto from 'node:crypto'
import fs from 'node:fs'
import os from 'node:os'
import path from 'node:path'
import {afterAll, beforeAll, expect, it} from 'vitest'
import {dockerCli} from '../../../../src/sandbox/docker/cli.js'
import {SYNC_DIR} from '../../../../src/runtime/agent-run/workspace-changes.js'
import {pullWorkspace, type SyncedVolume} from '../../../../src/runtime/runners/container/workspace-sync.js'
import {BASE_IMAGE, describeWithDocker} from '../../../helpers/docker-env.js'

/*
 * When a run's trailer is lost, the host lists its changes again from the volume (workspace-sync.ts,
 * listChangesAgain) against a real engine: only for the run whose mark is there, never another's.
 * What agent-run itself sends is tested in test/runtime/agent-run/workspace-changes.test.ts.
 */
/** A volume on the local engine; `coarse`: on an ext4 with 128-byte inodes, which stamps whole seconds. */
interface TestVolume {
  name: string
  remove(): void
}

function makeVolume(name: string, coarse: boolean, dir: string): TestVolume {
  if (!coarse) {
    execaSync('docker', ['volume', 'create', name])
    return {name, remove: () => execaSync('docker', ['volume', 'rm', '-f', name], {reject: false})}
  }
  const image = path.join(dir, 'coarse.ext4')
  execaSync('truncate', ['-s', '64M', image])
  execaSync('mkfs.ext4', ['-q', '-F', '-I', '128', image])
  const device = execaSync('losetup', ['--find', '--show', image]).stdout.trim()
  execaSync('docker', ['volume', 'create', '--opt', 'type=ext4', '--opt', `device=${device}`, name])
  return {
    name,
    remove: () => {
      execaSync('docker', ['volume', 'rm', '-f', name], {reject: false})
      execaSync('losetup', ['-d', device], {reject: false})
    },
  }
}

for (const coarse of [false, true])
  describeWithDocker(
    `a run’s changes listed again from its volume on a sync engine${coarse ? ', on a filesystem that stamps whole seconds' : ''}`,
    () => {
      const tag = crypto.randomBytes(4).toString('hex')
      let volume: string
      let made: TestVolume | undefined
      let root: string
      // what the volume held a tick before the mark: a whole second on the coarse filesystem
      const tick = coarse ? 1100 : 100

      const docker = (args: string[], input?: string) => execa('docker', args, {input, reject: false})
      /** Writes in the volume as a push would (a container of its own), then waits `ms`. */
      const writeVolume = async (script: string, ms = 0) => {
        const result = await docker(['run', '--rm', '-v', `${volume}:/workspace`, BASE_IMAGE, 'sh', '-c', script])
        expect(result.exitCode, result.stderr).toBe(0)
        await new Promise((resolve) => setTimeout(resolve, ms))
      }
      /** A fresh host workspace, what the host knows of the volume, and a helper running as `uid`. */
      const listing = (uid: number) => {
        const workspace = fs.mkdtempSync(path.join(root, 'ws-'))
        const state: SyncedVolume = {volume, synced: {}, file: path.join(root, 'state.json'), spoolDir: root}
        const helper = {image: BASE_IMAGE, uid, gid: uid, labels: {}}
        return {workspace, state, options: {workspace, maxBytes: 1024 * 1024, log: () => {}, pushed: false, helper}}
      }
      beforeAll(async () => {
        root = fs.mkdtempSync(path.join(os.tmpdir(), 'meepa-sync-mark-'))
        made = makeVolume(`meepa-test-sync-mark-${tag}`, coarse, root)
        volume = made.name
        // (a disk image's lost+found is removed when it is made, as workspace-sync.ts does)
        await writeVolume(
          'rmdir /workspace/lost+found 2>/dev/null; echo old > /workspace/before.txt && chown -R 0:0 /workspace',
          tick,
        )
      })
      afterAll(async () => {
        made?.remove()
        fs.rmSync(root, {recursive: true, force: true})
      })

      it('never takes changes for a run whose mark is not in the volume (listed again after a lost trailer)', async () => {
        // what agent-run leaves in the volume: its mark (workspace-changes.ts), then the run's writes
        await writeVolume(
          `mkdir -p /workspace/${SYNC_DIR} && echo run_earlier > /workspace/${SYNC_DIR}/mark && echo x > /workspace/earlier.txt`,
        )
        const {workspace, state, options} = listing(0)
        // a later run whose trailer was lost, and that never set its mark, finds the earlier run's
        await expect(pullWorkspace(dockerCli(), state, {...options, runId: 'run_later'})).rejects.toThrow(
          /left no list of its changes/,
        )
        expect(fs.existsSync(path.join(workspace, 'earlier.txt'))).toBe(false)
        // the run that set it gets its changes listed again from the volume
        await pullWorkspace(dockerCli(), state, {...options, runId: 'run_earlier'})
        expect(fs.readFileSync(path.join(workspace, 'earlier.txt'), 'utf8')).toBe('x\n')
        expect(fs.existsSync(path.join(workspace, 'before.txt'))).toBe(false)
      })

      it('lists everything below a folder the run renamed (a rename leaves its files’ times alone)', async () => {
        await writeVolume('mkdir -p /workspace/reports/q && echo q1 > /workspace/reports/q/q1.txt', tick)
        // after the files were written, before the rename (whole seconds on the coarse filesystem)
        const since = coarse
          ? `${BigInt(Math.floor(Date.now() / 1000)) * 1_000_000_000n - 1n}`
          : `${BigInt(Date.now()) * 1_000_000n}`
        await writeVolume(
          `echo run_renamed > /workspace/${SYNC_DIR}/mark && mv /workspace/reports /workspace/archive && ` +
            `ln -s archive/q /workspace/latest-${'x'.repeat(120)} && ln -s ${'far/'.repeat(40)}end /workspace/long`,
        )
        const {workspace, state, options} = listing(0)
        await pullWorkspace(dockerCli(), state, {...options, runId: 'run_renamed', since})
        expect(fs.readFileSync(path.join(workspace, 'archive', 'q', 'q1.txt'), 'utf8')).toBe('q1\n')
        // the run's links come as links, long names and targets too (GNU tar's PAX records)
        expect(fs.readlinkSync(path.join(workspace, `latest-${'x'.repeat(120)}`))).toBe('archive/q')
        expect(fs.readlinkSync(path.join(workspace, 'long'))).toBe(`${'far/'.repeat(40)}end`)
      })

      it('lists from the start agent-run said, not from a mark the agent moved; a file it could not read fails the listing', async () => {
        // a second ago, in whole seconds (as the coarse filesystem stamps)
        const since = `${BigInt(Math.floor(Date.now() / 1000) - 1) * 1_000_000_000n}`
        await writeVolume(
          `mkdir -p /workspace/${SYNC_DIR} && echo run_moved > /workspace/${SYNC_DIR}/mark && echo y > /workspace/moved.txt && ` +
            `touch -d '+1 hour' /workspace/${SYNC_DIR}/mark`,
        )
        const {workspace, state, options} = listing(1000)
        await pullWorkspace(dockerCli(), state, {...options, runId: 'run_moved', since})
        expect(fs.readFileSync(path.join(workspace, 'moved.txt'), 'utf8')).toBe('y\n')
        // a file the helper cannot read: its tar is whole but not the changes
        await writeVolume(
          `echo run_locked > /workspace/${SYNC_DIR}/mark && echo z > /workspace/locked.txt && chmod 000 /workspace/locked.txt && chown 1000 /workspace/locked.txt`,
        )
        await expect(pullWorkspace(dockerCli(), state, {...options, runId: 'run_locked', since})).rejects.toThrow(
          /could not list the run's changes/,
        )
        await writeVolume('rm -f /workspace/locked.txt')
      })
    },
  )
