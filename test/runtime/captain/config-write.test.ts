import {execa} from 'execa'
import fs from 'node:fs'
import path from 'node:path'
import {afterEach, describe, expect, it} from 'vitest'
import {loadConfig} from '../../../src/runtime/config/load.js'
import {applyConfigEdits, patchToEdits, updateConfigFile, writeFileAtomic} from '../../../src/runtime/config/write.js'
import {ROOT, makeHome, type TestHome} from '../../helpers/home.js'
import {captainConfig} from './helpers.js'

describe('config writes', () => {
  let home: TestHome | undefined
  afterEach(() => home?.cleanup())

  it('keeps comments and untouched layout when a field is edited', () => {
    const text = captainConfig([{id: 'meepa', name: 'Meepa'}])
    const edited = applyConfigEdits(
      text,
      patchToEdits(['agents', 0], {file_access: {unrestricted: true}, name: 'Renamed'}),
    )
    expect(edited).toContain('# operator comment at the top')
    expect(edited).toContain('# the base we import locally')
    expect(edited).toContain('unrestricted: true')
    expect(edited).toContain('Renamed')
    const removed = applyConfigEdits(edited, patchToEdits(['agents', 0], {file_access: {unrestricted: null}}))
    expect(removed).not.toContain('unrestricted')
  })

  it('keeps the comment after a value it replaces', () => {
    const edited = applyConfigEdits('image_config:\n  packages: []             # e.g. [git, python3]\n', [
      {path: ['image_config', 'packages'], value: ['jq']},
    ])
    expect(edited).toContain('# e.g. [git, python3]')
    expect(edited).toContain('jq')
  })

  it('validates with the config schema before writing: an invalid change leaves the file as it was', () => {
    home = makeHome(captainConfig())
    const before = fs.readFileSync(home.configPath, 'utf8')
    expect(() =>
      updateConfigFile(home!.configPath, [{path: ['agents', 0, 'container_mode', 'memory_limit'], value: 'lots'}], {
        env: {FAKE_LLM_KEY: 'x'},
      }),
    ).toThrow(/agents\[0\]\.container_mode\.memory_limit: must match/)
    expect(fs.readFileSync(home.configPath, 'utf8')).toBe(before)
  })

  it('a failure between writing the temp file and the rename leaves the old config and no temp file', () => {
    home = makeHome(captainConfig())
    const before = fs.readFileSync(home.configPath, 'utf8')
    let temp = ''
    expect(() =>
      updateConfigFile(home!.configPath, [{path: ['agents', 0, 'name'], value: 'New name'}], {
        env: {FAKE_LLM_KEY: 'x'},
        beforeRename: (file) => {
          temp = file
          expect(fs.readFileSync(file, 'utf8')).toContain('New name') // the new text was complete on disk
          throw new Error('disk gone')
        },
      }),
    ).toThrow(/disk gone/)
    expect(fs.readFileSync(home.configPath, 'utf8')).toBe(before)
    expect(fs.existsSync(temp)).toBe(false)
  })

  it('a process killed between write and rename leaves the old config intact and loadable', async () => {
    home = makeHome(captainConfig())
    const before = fs.readFileSync(home.configPath, 'utf8')
    const script = `
      import {updateConfigFile} from ${JSON.stringify(path.join(ROOT, 'src/runtime/config/write.ts'))}
      updateConfigFile(process.argv[1], [{path: ['agents', 0, 'name'], value: 'Half written'}], {
        env: {FAKE_LLM_KEY: 'x'},
        beforeRename: () => process.kill(process.pid, 'SIGKILL'),
      })
    `
    const result = await execa(
      process.execPath,
      ['--import', 'tsx', '--input-type=module', '-e', script, home.configPath],
      {reject: false, timeout: 30_000, cwd: ROOT},
    )
    expect(result.signal).toBe('SIGKILL')
    expect(fs.readFileSync(home.configPath, 'utf8')).toBe(before)
    // the orphaned temp file is next to it, and the loader ignores it
    expect(fs.readdirSync(home.home).some((name) => name.endsWith('.tmp'))).toBe(true)
    expect(loadConfig({home: home.home, env: {FAKE_LLM_KEY: 'x'}}).config.agents[0]?.name).toBe('Meepa')
  })

  it('writes atomically: a new file gets mode 0600, an existing one keeps its mode', () => {
    home = makeHome()
    const file = path.join(home.home, 'fresh.yaml')
    writeFileAtomic(file, 'a: 1\n')
    expect(fs.statSync(file).mode & 0o777).toBe(0o600)
    fs.chmodSync(file, 0o640)
    writeFileAtomic(file, 'a: 2\n')
    expect(fs.statSync(file).mode & 0o777).toBe(0o640)
    expect(fs.readFileSync(file, 'utf8')).toBe('a: 2\n')
  })
})
