import fs from 'node:fs'
import os from 'node:os'
import path from 'node:path'
import {afterAll, beforeAll, describe, expect, it} from 'vitest'
import {homeLabel} from '../../src/sandbox/docker/home-label.js'
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
    home?.cleanup()
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

describe('an engine whose words hold control characters', () => {
  const ESC = '\u001b'
  // a forged second line, a screen clear and cursor home, a window title, a hyperlink, and a line
  // overwritten by a carriage return and an erase
  const version = `24.0.0 (API 1.41)\n  engine: Docker 99 (API 1.45)${ESC}[2J${ESC}[1;1H${ESC}]0;owned\u0007`
  const name = `meepa-far-1\r${ESC}[2Kfake line: engine ok`
  const agent = `far${ESC}]8;;https://example.invalid/${ESC}\\click${ESC}]8;;${ESC}\\`
  let engine: LyingEngine
  let home: TestHome

  beforeAll(async () => {
    home = makeHome(
      fakeLlmConfig(
        'http://127.0.0.1:9/v1',
        [{id: 'far', container_mode: {enabled: true, network: 'none', engines: ['liar']}}],
        {engines: [{name: 'liar', host: 'unix:///nowhere.sock'}]},
      ),
    )
    engine = await startLyingEngine({
      version,
      containers: [
        {
          Id: 'c'.repeat(64),
          Name: name,
          // this home's, left behind (exited): `container clean` names it too
          Labels: {meepagateway: '1', 'meepagateway.home': homeLabel(home.home), 'meepagateway.agent': agent},
          State: `exited${ESC}[31m`,
        },
      ],
    })
    const config = path.join(home.home, 'config.yaml')
    fs.writeFileSync(config, fs.readFileSync(config, 'utf8').replace('unix:///nowhere.sock', engine.host))
  })
  afterAll(async () => {
    home?.cleanup()
    await engine?.close()
  })

  /** What a terminal would be told: no escape, no carriage return, nothing else below a space but line ends. */
  function expectInert(output: string): void {
    // eslint-disable-next-line no-control-regex -- control characters are exactly what is looked for
    const controls = output.match(/[\u0000-\u0009\u000b-\u001f\u007f-\u009f]/g) ?? []
    expect(controls.map((char) => `U+${char.charCodeAt(0).toString(16).padStart(4, '0')}`)).toEqual([])
  }

  it('`container status` shows them escaped, on the lines they belong to', async () => {
    const result = await runCli(['container', 'status'], {home: home.home, env: {FORCE_COLOR: '0'}})
    expect(result.exitCode, result.stderr + result.stdout).toBe(0)
    expectInert(result.stdout)
    const lines = result.stdout.split('\n')
    // one engine line, the real one: the forged one is part of it, readable
    expect(lines.filter((line) => /engine: Docker/.test(line))).toEqual([
      '  engine: Docker 24.0.0 (API 1.41)\\n  engine: Docker 99 (API 1.45)\\x1b[2J\\x1b[1;1H\\x1b]0;owned\\x07 (API 1.41)',
    ])
    expect(lines.some((line) => line.trimStart().startsWith('fake line'))).toBe(false)
    expect(result.stdout).toContain('meepa-far-1\\r\\x1b[2Kfake line: engine ok exited\\x1b[31m')
    // the terminator's own backslash doubled: what it ends can never pass for an escape
    expect(result.stdout).toContain('agent=far\\x1b]8;;https://example.invalid/\\x1b\\\\click\\x1b]8;;\\x1b\\\\')
  })

  it('`container clean --dry-run` shows them escaped', async () => {
    const result = await runCli(['container', 'clean', '--dry-run'], {home: home.home, env: {FORCE_COLOR: '0'}})
    expect(result.exitCode, result.stderr + result.stdout).toBe(0)
    expectInert(result.stdout)
    expect(result.stdout).toContain(
      'would remove container meepa-far-1\\r\\x1b[2Kfake line: engine ok (exited\\x1b[31m, agent far\\x1b]8;;',
    )
  })
})
