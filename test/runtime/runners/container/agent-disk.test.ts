import fs from 'node:fs'
import os from 'node:os'
import path from 'node:path'
import {afterAll, beforeAll, describe, expect, it} from 'vitest'
import {podmanVolumeHere} from '../../../../src/runtime/runners/container/agent-disk.js'
import type {DockerEngine} from '../../../../src/runtime/runners/container/engines.js'
import {DockerCli} from '../../../../src/sandbox/docker/cli.js'
import {startLyingEngine, type LyingEngine} from '../../../fakes/lying-engine.js'

/*
 * A Podman engine of this machine says where the agent's volume is, and the gateway measures
 * limits.disk there during the run: a lying one must not have it walk any other folder.
 */
describe('where a local Podman engine says a volume is', () => {
  let engine: LyingEngine
  let root: string
  const said = new Map<string, string>()

  beforeAll(async () => {
    root = fs.mkdtempSync(path.join(os.tmpdir(), 'meepa-podman-volumes-'))
    engine = await startLyingEngine({volumeMountpoint: (name) => said.get(name) ?? '/'})
  })
  afterAll(async () => {
    await engine?.close()
    fs.rmSync(root, {recursive: true, force: true})
  })

  const here = (volume: string) => {
    const cli = new DockerCli({baseEnv: {PATH: process.env.PATH}, engineArgs: ['--host', engine.host], configDir: root})
    const podman = {
      name: 'pod',
      cli,
      config: {name: 'pod', kind: 'podman', host: engine.host},
    } as unknown as DockerEngine
    return podmanVolumeHere(cli, podman, volume)
  }

  it('takes the volume’s own folder, and no other: not `/`, a home, or a path that climbs out', async () => {
    const own = path.join(root, 'volumes', 'meepa-ws-1-far', '_data')
    fs.mkdirSync(own, {recursive: true})
    said.set('meepa-ws-1-far', own)
    expect(await here('meepa-ws-1-far')).toBe(own)
    said.set('meepa-ws-1-root', '/')
    expect(await here('meepa-ws-1-root')).toBeUndefined()
    said.set('meepa-ws-1-home', os.homedir())
    expect(await here('meepa-ws-1-home')).toBeUndefined()
    fs.mkdirSync(path.join(root, 'volumes', 'meepa-ws-1-up', '_data'), {recursive: true})
    said.set('meepa-ws-1-up', `${path.join(root, 'volumes', 'meepa-ws-1-up', '_data')}/../../meepa-ws-1-up/_data`)
    expect(await here('meepa-ws-1-up')).toBeUndefined()
    expect(engine.requests).toContain('GET /volumes/meepa-ws-1-root')
  })
})
