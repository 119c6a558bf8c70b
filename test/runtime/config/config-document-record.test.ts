import {execa} from 'execa'
import {execFileSync} from 'node:child_process'
import fs from 'node:fs'
import path from 'node:path'
import {afterEach, beforeEach, describe, expect, it, vi} from 'vitest'
import {BIN, makeHome, type TestHome} from '../../helpers/home.js'

// The config's parsed YAML is remembered for its text (MEEPAGATEWAY_HOME/cache/config-document.json),
// so a light command does not parse it again. Parses are counted through a spy on the yaml package.
const parses = vi.hoisted(() => ({count: 0}))
vi.mock('yaml', async (importOriginal) => {
  const real = await importOriginal<typeof import('yaml')>()
  const parseDocument = ((...args: Parameters<typeof real.parseDocument>) => {
    parses.count++
    return real.parseDocument(...args)
  }) as typeof real.parseDocument
  // load.ts imports the default export, an object of the same functions
  return {...real, default: {...(real as unknown as {default: typeof real}).default, parseDocument}, parseDocument}
})
const {loadConfig} = await import('../../../src/runtime/config/load.js')

const provider = {kind: 'openai', api_key_env: 'FAKE_LLM_KEY', model: 'm', base_url: 'http://127.0.0.1:1/v1'}
const configText = (agent: string) =>
  `providers:\n  primary: fake\n  providers:\n    fake: ${JSON.stringify(provider)}\nagents:\n  - id: ${agent}\n`

describe('the remembered config document', () => {
  let home: TestHome
  let record: string
  beforeEach(() => {
    home = makeHome(configText('first'))
    record = path.join(home.home, 'cache', 'config-document.json')
    parses.count = 0
  })
  afterEach(() => home.cleanup())
  const load = () => loadConfig({home: home.home, env: {}})
  const agentIds = () => load().config.agents.map((agent) => agent.id)
  /** A record for the present text whose document says something else, as a forger would write it. */
  const forge = (file: string) => {
    const document = {
      providers: {primary: 'fake', providers: {fake: provider}},
      agents: [{id: 'forged', file_access: {unrestricted: true}}],
    }
    fs.writeFileSync(
      file,
      JSON.stringify({
        key: `source:${process.pid}\n${fs.readFileSync(home.configPath, 'utf8')}`,
        at: Date.now(),
        answer: document,
      }),
      {mode: 0o600},
    )
  }

  it('is parsed once, then read back, and an edit is parsed again', () => {
    expect(agentIds()).toEqual(['first'])
    expect(parses.count).toBe(1)
    expect(fs.statSync(record).mode & 0o777).toBe(0o600)
    expect(agentIds()).toEqual(['first'])
    expect(parses.count).toBe(1)
    // the same length and, at this clock's resolution, possibly the same mtime: the text is the key
    home.writeConfig(configText('fresh'))
    expect(agentIds()).toEqual(['fresh'])
    expect(parses.count).toBe(2)
  })

  it('the record is the one written by the same build (from src/, the same process): a record of ours is read as is', () => {
    load()
    forge(record)
    expect(agentIds()).toEqual(['forged'])
    // another build's record (an upgrade, another install sharing the home, another run from src/) is not
    const forged = JSON.parse(fs.readFileSync(record, 'utf8')) as {key: string}
    fs.writeFileSync(
      record,
      JSON.stringify({...forged, key: forged.key.replace(`source:${process.pid}`, 'source:1')}),
      {mode: 0o600},
    )
    expect(agentIds()).toEqual(['first'])
  })

  it('a record another user could have written, a symlink, a FIFO or garbage is not read', () => {
    load()
    const count = parses.count
    forge(record)
    fs.chmodSync(record, 0o620) // group-writable
    expect(agentIds()).toEqual(['first'])
    if (process.getuid?.() === 0) {
      forge(record)
      fs.chownSync(record, 65534, 65534)
      expect(agentIds()).toEqual(['first'])
    }
    const elsewhere = path.join(home.home, 'planted.json')
    forge(elsewhere)
    fs.rmSync(record, {force: true})
    fs.symlinkSync(elsewhere, record)
    expect(agentIds()).toEqual(['first'])
    fs.rmSync(record, {force: true})
    execFileSync('mkfifo', [record])
    expect(agentIds()).toEqual(['first']) // and did not block on the FIFO
    fs.rmSync(record, {force: true})
    fs.writeFileSync(record, '{"key": "', {mode: 0o600})
    expect(agentIds()).toEqual(['first'])
    expect(parses.count).toBeGreaterThan(count)
  })

  it('a value JSON cannot carry exactly (.inf, -0) is never remembered', () => {
    for (const [written, value] of [
      ['.inf', Number.POSITIVE_INFINITY],
      ['-0', -0],
    ] as const) {
      home.writeConfig(`${configText('first')}gateway:\n  shutdown_grace_seconds: ${written}\n`)
      for (let load = 0; load < 2; load++)
        expect(loadConfig({home: home.home, env: {}}).config.gateway.shutdown_grace_seconds).toBe(value)
      expect(fs.existsSync(record)).toBe(false)
    }
  })

  it('a config given outside a home that does not exist creates no home', () => {
    const missingHome = path.join(home.home, 'no-such-home')
    expect(loadConfig({home: missingHome, configPath: home.configPath, env: {}}).config.agents[0]?.id).toBe('first')
    expect(fs.existsSync(missingHome)).toBe(false)
  })
})

// The shipped CLI: `config check` after an edit reports the edit, not what it remembered.
it('config check of the built CLI sees each edit of the file', async () => {
  const home = makeHome(configText('first'))
  try {
    const check = () =>
      execa(process.execPath, [BIN, 'config', 'check', '--json'], {
        env: {MEEPAGATEWAY_HOME: home.home, FAKE_LLM_KEY: 'k', PATH: process.env.PATH},
        extendEnv: false,
        reject: false,
      })
    expect((await check()).exitCode).toBe(0)
    expect(fs.existsSync(path.join(home.home, 'cache', 'config-document.json'))).toBe(true)
    home.writeConfig(configText('Bad_Id'))
    const failed = await check()
    expect(failed.exitCode).not.toBe(0)
    expect(failed.stdout + failed.stderr).toMatch(/agents\[0\]\.id/)
    home.writeConfig(configText('second'))
    const again = await check()
    expect(again.exitCode).toBe(0)
    expect(again.stdout).toMatch(/"second"/)
  } finally {
    home.cleanup()
  }
})
