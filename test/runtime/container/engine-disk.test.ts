import {execa} from 'execa'
import fs from 'node:fs'
import os from 'node:os'
import path from 'node:path'
import {afterAll, beforeAll, expect, it} from 'vitest'
import {DockerCli} from '../../../src/sandbox/docker/cli.js'
import {attachEngineDisk, fsidOf, setupArgs} from '../../../src/runtime/container/engine-disk.js'
import {engineDisksVolume} from '../../../src/runtime/container/engine-state.js'
import {BASE_IMAGE, describeWithDocker} from '../../helpers/docker-env.js'

/*
 * The disk image behind an agent's volume on an engine, on the local engine: the setup container
 * reaches only the loop devices it was handed (never another tenant's disk on that host), and the
 * volume it leaves is the agent's filesystem, by the id every container checks.
 */

describeWithDocker('an agent’s disk image on an engine (engine-disk.ts)', () => {
  const tag = Math.random().toString(16).slice(2, 10)
  const homeLabel = `test-engine-disk-${tag}`
  const volume = `meepa-test-ws-${tag}`
  let home: string
  let secretFile: string
  let secretDevice = ''
  const cli = new DockerCli()
  const attach = () =>
    attachEngineDisk(cli, {
      home,
      engine: 'local',
      homeLabel,
      agentId: 'a1',
      volume,
      bytes: 8 * 1024 * 1024,
      image: BASE_IMAGE,
      labels: {},
    })

  beforeAll(async () => {
    home = fs.mkdtempSync(path.join(os.tmpdir(), 'meepa-engine-disk-'))
    // another tenant's disk on the same host
    secretFile = path.join(home, 'other-tenant.img')
    fs.writeFileSync(secretFile, Buffer.concat([Buffer.from('OTHER-TENANT-SECRET'), Buffer.alloc(1024 * 1024)]))
    secretDevice = (await execa('losetup', ['-f', '--show', secretFile])).stdout.trim()
  })

  afterAll(async () => {
    await execa('docker', ['volume', 'rm', '-f', volume], {reject: false})
    const images = await execa(
      'docker',
      ['run', '--rm', '-v', `${engineDisksVolume(homeLabel)}:/d`, BASE_IMAGE, 'ls', '/d'],
      {
        reject: false,
      },
    )
    for (const image of String(images.stdout)
      .split('\n')
      .filter((name) => name.endsWith('.ext4'))) {
      const held = await execa('sh', ['-c', `grep -l '/${image}' /sys/block/loop*/loop/backing_file`], {reject: false})
      for (const file of String(held.stdout).split('\n').filter(Boolean))
        await execa('losetup', ['-d', `/dev/${file.split('/')[3]}`], {reject: false})
    }
    await execa('docker', ['volume', 'rm', '-f', engineDisksVolume(homeLabel)], {reject: false})
    if (secretDevice) await execa('losetup', ['-d', secretDevice], {reject: false})
    fs.rmSync(home, {recursive: true, force: true})
  })

  it('attaches the image and leaves a volume whose filesystem id is the recorded one', async () => {
    const disk = await attach()
    expect(disk.fsid).toBe(fsidOf(disk.uuid))
    const seen = await execa('docker', [
      'run',
      '--rm',
      '-v',
      `${volume}:/workspace`,
      BASE_IMAGE,
      'stat',
      '-f',
      '-c',
      '%i %T',
      '/workspace',
    ])
    expect(seen.stdout.trim()).toBe(`${disk.fsid} ext2/ext3`)
    // attaching again finds the same device: nothing made twice
    const again = await attach()
    expect(again.device).toBe(disk.device)
    expect(again.uuid).toBe(disk.uuid)
  }, 120_000)

  it('never lets the setup container open a loop device it was not handed (another tenant’s disk)', async () => {
    const number = fs.readFileSync(`/sys/block/${path.basename(secretDevice)}/dev`, 'utf8').trim()
    const attempt = (devices: string[]) =>
      execa(
        'docker',
        [
          ...setupArgs(engineDisksVolume(homeLabel), BASE_IMAGE, {}, `meepa-test-setup-${tag}`, devices),
          '-c',
          `head -c 19 ${secretDevice}`,
        ],
        {reject: false},
      )
    const refused = await attempt([])
    expect(refused.stdout).not.toContain('OTHER-TENANT-SECRET')
    expect(refused.stderr).toMatch(/Operation not permitted/)
    // handed that very device, it could: the refusal above is the device rule's
    expect((await attempt([number])).stdout).toBe('OTHER-TENANT-SECRET')
  }, 60_000)
})
