import {execa, execaSync} from 'execa'
import crypto from 'node:crypto'
import fs from 'node:fs'
import os from 'node:os'
import path from 'node:path'
import {afterAll, beforeAll, expect, it} from 'vitest'
import {dockerCli} from '../../../../src/sandbox/docker/cli.js'
import {splitSyncTrailer} from '../../../../src/runtime/runners/container/sync-trailer.js'
import {
  pullWorkspace,
  syncGoLine,
  syncingCommand,
  type SyncedVolume,
} from '../../../../src/runtime/runners/container/workspace-sync.js'
import {readTar} from '../../../../src/runtime/util/tar.js'
import {BASE_IMAGE, describeWithDocker} from '../../../helpers/docker-env.js'

/*
 * A run container on a sync engine (workspace-sync.ts, syncingCommand) against a real engine: what
 * the run writes after its go line comes back, what the volume held before does not, nor what the
 * push wrote just before the go line; changes listed again from the volume are never another
 * run's; and a run that filled its volume still sends what it changed.
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
    `the run container’s change list on a sync engine${coarse ? ', on a filesystem that stamps whole seconds' : ''}`,
    () => {
      const tag = crypto.randomBytes(4).toString('hex')
      let volume: string
      let made: TestVolume | undefined
      const containers: string[] = []
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
      /**
       * One run: the syncing program around `command`, its go line once the container waits for it
       * (as a standby's does, `beforeGo` run just before), and what it sends back.
       */
      const run = async (
        runId: string,
        pushed: boolean,
        command: string,
        beforeGo?: (name: string) => Promise<void>,
        maxBytes = 1024 * 1024,
      ) => {
        const name = `meepa-test-sync-mark-${tag}-${containers.length}`
        containers.push(name)
        const {entrypoint, command: args} = syncingCommand(['sh', '-c', command])
        const child = execa(
          'docker',
          ['run', '-i', '--name', name, '-v', `${volume}:/workspace`, '--entrypoint', entrypoint, BASE_IMAGE, ...args],
          {buffer: false, reject: false},
        )
        const split = splitSyncTrailer(child.stdout!, maxBytes)
        split.frames.resume()
        while ((await docker(['exec', name, 'test', '-s', '/tmp/.meepa-forwarder'])).exitCode !== 0)
          await new Promise((resolve) => setTimeout(resolve, 50))
        await beforeGo?.(name)
        child.stdin!.end(`${syncGoLine(runId, pushed)}the input\n`)
        const trailer = await split.trailer
        await child
        expect(trailer).toBeDefined()
        const names = trailer!.list.toString('utf8').split('\0').filter(Boolean).sort()
        const changed = [...readTar(trailer!.changes, maxBytes)]
          .filter((entry) => entry.type === '0')
          .map((entry) => entry.name.replace(/^\.\//, ''))
          .sort()
        return {name, names, changed}
      }

      beforeAll(async () => {
        root = fs.mkdtempSync(path.join(os.tmpdir(), 'meepa-sync-mark-'))
        made = makeVolume(`meepa-test-sync-mark-${tag}`, coarse, root)
        volume = made.name
        await writeVolume('echo old > /workspace/before.txt && chown -R 0:0 /workspace', tick)
      })
      afterAll(async () => {
        await docker(['rm', '-f', ...containers])
        made?.remove()
        fs.rmSync(root, {recursive: true, force: true})
      })

      it('takes what the run wrote after its go line, not what the volume held before', async () => {
        const {names, changed} = await run('run_first', false, 'cat > /dev/null; echo new > /workspace/after.txt')
        expect(names).toEqual(expect.arrayContaining(['./after.txt', './before.txt']))
        expect(changed).toEqual(['after.txt'])
      })

      it('after a push, what the push wrote just before the go line is not the run’s', async () => {
        const {changed} = await run(
          'run_pushed',
          true,
          'cat > /dev/null; echo mine > /workspace/mine.txt',
          async (name) => {
            const pushed = await docker(['exec', name, 'sh', '-c', 'echo pushed > /workspace/pushed.txt'])
            expect(pushed.exitCode, pushed.stderr).toBe(0)
          },
        )
        expect(changed).toEqual(['mine.txt'])
      })

      it('never takes changes for a run whose mark is not in the volume (listed again after a lost trailer)', async () => {
        await run('run_earlier', false, 'cat > /dev/null; echo x > /workspace/earlier.txt')
        const workspace = fs.mkdtempSync(path.join(root, 'ws-'))
        const state: SyncedVolume = {volume, synced: {}, file: path.join(root, 'state.json')}
        const options = {
          workspace,
          maxBytes: 1024 * 1024,
          log: () => {},
          pushed: false,
          helper: {image: BASE_IMAGE, uid: 0, gid: 0, labels: {}},
        }
        // a later run whose trailer was lost, and that never set its mark, finds the earlier run's
        await expect(pullWorkspace(dockerCli(), state, {...options, runId: 'run_later'})).rejects.toThrow(
          /left no list of its changes/,
        )
        expect(fs.existsSync(path.join(workspace, 'earlier.txt'))).toBe(false)
        // the run that set it gets its changes listed again from the volume
        await pullWorkspace(dockerCli(), state, {...options, runId: 'run_earlier'})
        expect(fs.readFileSync(path.join(workspace, 'earlier.txt'), 'utf8')).toBe('x\n')
      })

      it('lists the changes itself, whatever the run left running in /tmp (a planted FIFO, a writer)', async () => {
        const {changed} = await run(
          `run_planted_${coarse ? 'c' : 'f'}`,
          true,
          'cat > /dev/null; mkfifo /tmp/.meepa-list /tmp/list; (exec 3<>/tmp/.meepa-list 4<>/tmp/list; printf forged >&3; sleep 60) & echo mine > /workspace/bg.txt',
        )
        expect(changed).toEqual(expect.arrayContaining(['bg.txt']))
      })

      if (coarse)
        it('sends back what a run changed when it filled its volume (the list is never written there)', async () => {
          const {changed} = await run(
            'run_full',
            false,
            'cat > /dev/null; echo small > /workspace/small.txt; dd if=/dev/zero of=/workspace/fill bs=1M count=100 2>/dev/null; true',
            undefined,
            128 * 1024 * 1024,
          )
          // (with the mark's whole second: what the last run wrote then may come once more)
          expect(changed).toEqual(expect.arrayContaining(['fill', 'small.txt']))
          await writeVolume('rm -f /workspace/fill')
        })
    },
  )
