import {execa} from 'execa'
import crypto from 'node:crypto'
import fs from 'node:fs'
import os from 'node:os'
import path from 'node:path'
import {afterAll, beforeAll, describe, expect, it} from 'vitest'
import {dockerCli, type DockerCli, type DockerResult} from '../../../../src/sandbox/docker/cli.js'
import {DockerCommandError, dockerDown, dockerHung} from '../../../../src/sandbox/docker/errors.js'
import {endedOnLostVolume} from '../../../../src/runtime/container/engine-disk.js'
import {
  forgetVolume,
  pushWorkspace,
  snapshotWorkspace,
  type SyncedVolume,
} from '../../../../src/runtime/runners/container/workspace-sync.js'
import {BASE_IMAGE, describeWithDocker} from '../../../helpers/docker-env.js'

/*
 * The push that brings an agent's volume on a sync engine to the host's workspace
 * (workspace-sync.ts, pushWorkspace), against a real engine: whatever the host removed and however
 * the volume differs from what the host knows of it, the push goes through, and a push that fails
 * leaves no record the next one would trust.
 */

describeWithDocker('pushing the host’s workspace to an agent’s volume on a sync engine (real engine)', () => {
  const volume = `meepa-test-push-${crypto.randomBytes(4).toString('hex')}`
  let root: string
  let workspace: string
  let state: SyncedVolume
  const push = () => pushWorkspace(dockerCli(), state, {workspace, image: BASE_IMAGE, uid: 1000, gid: 1000, labels: {}})
  /** Runs `script` in the volume as the run's user would (in /workspace). */
  const inVolume = async (script: string) => {
    const result = await execa(
      'docker',
      [
        'run',
        '--rm',
        '--user',
        '1000:1000',
        '-v',
        `${volume}:/workspace`,
        '-w',
        '/workspace',
        BASE_IMAGE,
        'sh',
        '-c',
        script,
      ],
      {reject: false},
    )
    expect(result.exitCode, result.stderr).toBe(0)
    return result.stdout
  }

  beforeAll(async () => {
    root = fs.mkdtempSync(path.join(os.tmpdir(), 'meepa-push-'))
    workspace = path.join(root, 'ws')
    fs.mkdirSync(workspace)
    await execa('docker', ['volume', 'create', volume])
    state = {volume, synced: undefined, file: path.join(root, 'record.json'), spoolDir: root}
  })
  afterAll(async () => {
    await execa('docker', ['volume', 'rm', '-f', volume], {reject: false})
    fs.rmSync(root, {recursive: true, force: true})
  })

  it('removes more names than fit in an argv (1,200 names of 2 KB): they go on the helper’s stdin', async () => {
    // a folder 1,800 bytes deep (each name at most 255), 1,200 files of 200 bytes in it
    const deep = Array.from({length: 9}, (_, i) => `${i}${'d'.repeat(199)}`).join('/')
    fs.mkdirSync(path.join(workspace, deep), {recursive: true})
    const names = Array.from({length: 1200}, (_, i) => `${deep}/${String(i).padStart(4, '0')}${'f'.repeat(196)}`)
    for (const name of names) fs.writeFileSync(path.join(workspace, name), '')
    fs.writeFileSync(path.join(workspace, '-leading-dash'), 'x')
    fs.writeFileSync(path.join(workspace, 'stays.txt'), 'stays')
    await push()
    expect(Number(await inVolume('find . -path ./.meepa-sync -prune -o -type f -print | wc -l'))).toBe(1202)
    // the host removes them all: more than 2 MB of names
    expect(names.reduce((sum, name) => sum + Buffer.byteLength(name) + 1, 0)).toBeGreaterThan(2 * 1024 * 1024)
    fs.rmSync(path.join(workspace, deep.split('/')[0]!), {recursive: true})
    fs.rmSync(path.join(workspace, '-leading-dash'))
    const {sent, wrote} = await push()
    expect([sent, wrote]).toEqual([0, true])
    // the sync's folder, made by the push that filled the volume, stays
    expect((await inVolume('ls -A')).split('\n')).toEqual(['.meepa-sync', 'stays.txt'])
    expect(state.synced).toEqual(snapshotWorkspace(workspace))
  }, 180_000)

  it('replaces what the volume holds as another kind at a name the host never knew it had (a folder with files where the host sends a file)', async () => {
    // what a run left that the host refused (its folder where the host had made a file meanwhile):
    // in the volume, unknown to the host's record
    await inVolume(
      'mkdir -p clash/inner && echo run > clash/inner/f && mkdir elsewhere && ln -s elsewhere linked && ' +
        'mkdir kept && echo run > kept/from-the-run',
    )
    fs.writeFileSync(path.join(workspace, 'clash'), 'the host’s file')
    fs.mkdirSync(path.join(workspace, 'linked'))
    fs.writeFileSync(path.join(workspace, 'linked', 'a'), 'a')
    fs.mkdirSync(path.join(workspace, 'kept'))
    fs.writeFileSync(path.join(workspace, 'kept', 'h'), 'h')
    await push()
    expect(await inVolume('cat clash')).toBe('the host’s file')
    // the link is replaced by the host's folder, never written through
    expect(await inVolume('[ -d linked ] && [ ! -L linked ] && ls -A linked elsewhere')).toBe(
      'elsewhere:\n\nlinked:\na',
    )
    // a folder the host sends too keeps what it holds
    expect((await inVolume('ls -A kept')).split('\n')).toEqual(['from-the-run', 'h'])
  }, 60_000)

  it('goes through where the run took its own rights away (chmod 000 on the workspace and a folder in it)', async () => {
    fs.mkdirSync(path.join(workspace, 'locked'), {recursive: true})
    fs.writeFileSync(path.join(workspace, 'locked', 'inside.txt'), 'first')
    await push()
    await inVolume('chmod 000 locked /workspace')
    fs.writeFileSync(path.join(workspace, 'locked', 'inside.txt'), 'changed on the host')
    fs.writeFileSync(path.join(workspace, 'stays.txt'), 'stays')
    const {wrote} = await push()
    expect(wrote).toBe(true)
    expect(await inVolume('cat locked/inside.txt stays.txt')).toBe('changed on the hoststays')
    // filled whole again: the record knows it, the next push sends nothing
    expect((await push()).wrote).toBe(false)
    fs.rmSync(path.join(workspace, 'locked'), {recursive: true})
    await push()
  }, 60_000)

  it('before a fill, removes the agent’s own sync helpers still there (a client died), never another agent’s', async () => {
    const labelled = (agent: string) =>
      [
        'meepagateway=1',
        'meepagateway.home=h-push-test',
        `meepagateway.agent=${agent}`,
        'meepagateway.run=workspace-sync',
      ]
        .flatMap((label) => ['--label', label])
        .concat(['-v', `${volume}:/workspace`, BASE_IMAGE, 'sleep', '300'])
    const own = (await execa('docker', ['run', '-d', ...labelled('pusher')])).stdout.trim()
    const other = (await execa('docker', ['run', '-d', ...labelled('someone-else')])).stdout.trim()
    try {
      forgetVolume(state)
      fs.writeFileSync(path.join(workspace, 'stays.txt'), 'stays')
      const labels = {'meepagateway.home': 'h-push-test', 'meepagateway.agent': 'pusher'}
      await pushWorkspace(dockerCli(), state, {workspace, image: BASE_IMAGE, uid: 1000, gid: 1000, labels})
      const left = (await execa('docker', ['ps', '-aq', '--no-trunc'])).stdout
      expect(left).not.toContain(own)
      expect(left).toContain(other)
      expect(await inVolume('cat stays.txt')).toBe('stays')
    } finally {
      await execa('docker', ['rm', '-f', own, other], {reject: false})
    }
  }, 60_000)

  it('ends as lost on a volume the host knows without its fill’s token (made anew, filled by another), writing nothing', async () => {
    expect(await inVolume('cat .meepa-sync/filled')).toBe(state.fill)
    // another gateway's fill of a volume of that name
    await inVolume('echo 0123456789abcdef0123456789abcdef > .meepa-sync/filled')
    fs.writeFileSync(path.join(workspace, 'stays.txt'), 'changed on the host')
    const failed = await push().then(
      () => undefined,
      (error: unknown) => error,
    )
    expect(failed).toBeInstanceOf(DockerCommandError)
    const {exitCode, stderr} = (failed as DockerCommandError).result
    expect(endedOnLostVolume(exitCode, stderr), stderr).toBe(true)
    expect(await inVolume('cat stays.txt')).toBe('stays')
    // the runner forgets the record (EngineVolumeLost): the next push fills it whole, its folder with it
    forgetVolume(state)
    await push()
    expect(await inVolume('cat .meepa-sync/filled')).toBe(state.fill)
    expect(await inVolume('cat stays.txt && ls -A')).toBe(
      'changed on the host.meepa-sync\nclash\nkept\nlinked\nstays.txt',
    )
    // the agent owns the file: a sparse one of 200 GB is refused at once, never read through
    await inVolume('rm .meepa-sync/filled && truncate -s 200G .meepa-sync/filled')
    fs.writeFileSync(path.join(workspace, 'stays.txt'), 'changed again')
    const startedAt = Date.now()
    const sparse = await push().then(
      () => undefined,
      (error: unknown) => error as DockerCommandError,
    )
    expect(endedOnLostVolume(sparse?.result.exitCode, sparse?.result.stderr ?? ''), sparse?.message).toBe(true)
    expect(Date.now() - startedAt).toBeLessThan(20_000)
  }, 60_000)
})

describe('a push that fails', () => {
  it('forgets what the volume holds: the next push empties it and sends the host’s workspace whole', async () => {
    const root = fs.mkdtempSync(path.join(os.tmpdir(), 'meepa-push-'))
    try {
      const workspace = path.join(root, 'ws')
      fs.mkdirSync(workspace)
      fs.writeFileSync(path.join(workspace, 'old.txt'), 'old')
      const file = path.join(root, 'record.json')
      const synced = snapshotWorkspace(workspace)
      const fill = 'c'.repeat(32)
      fs.writeFileSync(file, JSON.stringify({fill, files: synced}))
      const state: SyncedVolume = {volume: 'unused', synced, fill, file, spoolDir: path.dirname(file)}
      fs.writeFileSync(path.join(workspace, 'new.txt'), 'new')
      const calls: string[][] = []
      let failure: Error = dockerHung('docker run', 120_000)
      const listed: string[][] = []
      const cli = {
        check: (args: string[]) => {
          // the agent's helpers still there, looked for before a fill: none
          if (args[0] === 'ps') {
            listed.push(args)
            return Promise.resolve({exitCode: 0, stdout: '', stderr: ''})
          }
          calls.push(args)
          return Promise.reject(failure)
        },
      } as unknown as DockerCli
      const labels = {'meepagateway.home': 'h0', 'meepagateway.agent': 'a1'}
      const options = {workspace, image: 'unused', uid: 1000, gid: 1000, labels}
      // a push cut short (a timeout, an engine out of reach, its own exit 125) is only tried again
      for (const cut of [failure, dockerDown('Cannot connect to the Docker daemon'), helperFailed(125)]) {
        failure = cut
        await expect(pushWorkspace(cli, state, options)).rejects.toThrow()
        expect(state.synced).toEqual(synced)
        expect(calls.at(-1)!.join(' ')).not.toContain('--cap-add=CHOWN')
      }
      // its client died (killed, a connection dropped): forgotten, but its helper may still run there
      calls.length = 0
      failure = helperFailed(1)
      await expect(pushWorkspace(cli, state, options)).rejects.toThrow(/exit 1/)
      expect(state.synced).toBeUndefined()
      expect(calls).toHaveLength(1)
      state.synced = synced
      state.fill = fill
      // the helper's own steps failed (a name tar could not extract, the engine's disk full)
      failure = helperFailed(97)
      calls.length = 0
      await expect(pushWorkspace(cli, state, options)).rejects.toThrow(/exit 97/)
      expect(state.synced).toBeUndefined()
      expect(fs.existsSync(file)).toBe(false)
      // tried once more at once as on a new volume: given to the run's user again, then emptied
      // and sent whole; that failing too ends the push
      expect(calls).toHaveLength(2)
      expect(calls[0]!.join(' ')).not.toContain('--cap-add=CHOWN')
      expect(calls[1]!.join(' ')).toContain('--cap-add=CHOWN')
      // before it, the agent's own helpers an earlier client left running there were looked for
      expect(listed.at(-1)).toEqual([
        'ps',
        '-aq',
        '--filter',
        'label=meepagateway.home=h0',
        '--filter',
        'label=meepagateway.agent=a1',
        '--filter',
        'label=meepagateway.run=workspace-sync',
      ])
      // and the next push starts there again
      await expect(pushWorkspace(cli, state, options)).rejects.toThrow()
      expect(calls.at(-1)!.join(' ')).toContain('--cap-add=CHOWN')
    } finally {
      fs.rmSync(root, {recursive: true, force: true})
    }
  })
})

function helperFailed(exitCode: number): DockerCommandError {
  return new DockerCommandError(['run'], {exitCode, stdout: '', stderr: 'tar: something'} as DockerResult)
}
