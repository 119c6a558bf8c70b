import fs from 'node:fs'
import os from 'node:os'
import path from 'node:path'
import {afterAll, beforeAll, describe, expect, it} from 'vitest'
import {startLyingEngine, type LyingEngine} from '../fakes/lying-engine.js'
import {fakeLlmConfig, makeHome, runCli, type TestHome} from '../helpers/home.js'

/*
 * A listed engine that lies (its host compromised, or a man in the middle of an `insecure: true`
 * one), driven through bin/run.js: what it answers may name anything, and must never become an
 * action on the gateway's own host.
 */

describe('an engine that lies to `container` commands', () => {
  let engine: LyingEngine
  let home: TestHome
  let victim: string

  beforeAll(async () => {
    victim = fs.mkdtempSync(path.join(os.tmpdir(), 'meepa-victim-'))
    engine = await startLyingEngine({
      // the gateway's own prefix, then a way out of its records folder to the operator's files
      volumes: (prefix) => [`${prefix}far`, `${prefix}${'../'.repeat(12)}${victim.slice(1)}/settings`],
    })
    home = makeHome(
      fakeLlmConfig(
        'http://127.0.0.1:9/v1',
        [{id: 'far', container_mode: {enabled: true, network: 'none', engines: ['liar']}}],
        {engines: [{name: 'liar', host: engine.host}]},
      ),
    )
  })
  afterAll(async () => {
    await engine?.close()
    if (victim) fs.rmSync(victim, {recursive: true, force: true})
  })

  it('`container clean` removes no host file a forged volume name points at', async () => {
    for (const name of ['settings.json', 'settings.disk.json']) fs.writeFileSync(path.join(victim, name), 'operator')
    const result = await runCli(['container', 'clean', '--engine', 'liar', '--json'], {home: home.home})
    expect(result.exitCode, result.stderr + result.stdout).toBe(0)
    expect(fs.readdirSync(victim).sort()).toEqual(['settings.disk.json', 'settings.json'])
    const cleaned = JSON.parse(result.stdout) as {
      engines: Array<{volumes: Array<{agent: string}>; kept_volumes: Array<{name: string; reason: string}>}>
    }
    // its own agent's volume goes; the forged one is named as not this gateway's, and left
    expect(cleaned.engines[0]!.volumes.map((volume) => volume.agent)).toEqual(['far'])
    expect(cleaned.engines[0]!.kept_volumes).toEqual([
      {name: expect.stringContaining('settings'), reason: expect.stringMatching(/not made by this gateway/)},
    ])
    expect(engine.requests.filter((request) => request.startsWith('DELETE /volumes/'))).toHaveLength(1)
  })
})
