import {execa, execaSync} from 'execa'
import fs from 'node:fs'
import os from 'node:os'
import path from 'node:path'
import {expect, it} from 'vitest'
import {makeDirectories} from '../../../src/runtime/util/make-directories.js'
import {BIN} from '../../helpers/home.js'

it('makes each missing directory with its mode, and leaves existing ones as they are', () => {
  const root = fs.mkdtempSync(path.join(os.tmpdir(), 'meepa-mkdirs-'))
  try {
    fs.chmodSync(root, 0o755)
    makeDirectories(path.join(root, 'a', 'b', 'c'), 0o700)
    for (const dir of ['a', 'a/b', 'a/b/c']) expect(fs.statSync(path.join(root, dir)).mode & 0o777).toBe(0o700)
    expect(fs.statSync(root).mode & 0o777).toBe(0o755)
    makeDirectories(path.join(root, 'a', 'b'), 0o700) // already there
    fs.writeFileSync(path.join(root, 'file'), '')
    expect(() => makeDirectories(path.join(root, 'file', 'x'), 0o700)).toThrow(/ENOTDIR/)
    expect(() => makeDirectories(path.join(root, 'file'), 0o700)).toThrow(/EEXIST/)
    fs.symlinkSync(path.join(root, 'nowhere'), path.join(root, 'dangling'))
    expect(() => makeDirectories(path.join(root, 'dangling', 'home'), 0o700)).toThrow(/EEXIST/)
  } finally {
    fs.rmSync(root, {recursive: true, force: true})
  }
})

// Node's recursive mkdirSync loops forever on ENOENT under an existing parent, as procfs answers
it.skipIf(!fs.existsSync('/proc/self'))('a directory that cannot exist (under /proc) is an error, not a spin', () => {
  expect(() => makeDirectories('/proc/meepa-no-such-dir/home', 0o700)).toThrow(/ENOENT/)
})

it.skipIf(!fs.existsSync('/proc/self'))(
  'a MEEPAGATEWAY_HOME that cannot be made: each command says so and what to do, at once, with one exit status',
  async () => {
    for (const argv of [
      ['config', 'check'],
      ['agent', 'list'],
      ['agent', 'create', 'x'],
      ['runs'],
      ['serve'],
      ['send', '--agent', 'a', 'hi'],
    ]) {
      const result = await execa(process.execPath, [BIN, ...argv], {
        env: {PATH: process.env.PATH, MEEPAGATEWAY_HOME: '/proc/meepa-no-such-home'},
        extendEnv: false,
        reject: false,
        timeout: 20_000,
      })
      expect(result.timedOut, argv.join(' ')).toBe(false)
      expect(result.exitCode, `${argv.join(' ')}: ${result.stderr}`).toBe(5) // E_STATE
      expect(result.stderr, argv.join(' ')).toMatch(/\/proc\/meepa-no-such-home/)
      expect(result.stderr, argv.join(' ')).toMatch(/MEEPAGATEWAY_HOME/)
    }
  },
)

// Several first commands at once (a cron minute, a CI matrix): none may read the default config
// half written. strace holds each write(2) of the first one for 700 ms, so a name that appears
// before its bytes is seen for that long.
const hasStrace = execaSync('sh', ['-c', 'command -v strace'], {reject: false}).exitCode === 0
it.runIf(process.platform === 'linux' && hasStrace)(
  'the default config is never seen half written by a command started meanwhile',
  async () => {
    const root = fs.mkdtempSync(path.join(os.tmpdir(), 'meepa-first-'))
    const home = path.join(root, 'missing', 'home')
    const env = {PATH: process.env.PATH, MEEPAGATEWAY_HOME: home}
    const config = path.join(home, 'config.yaml')
    const slow = execa(
      'strace',
      [
        '-f',
        '-qq',
        '-o',
        '/dev/null',
        '-e',
        'trace=write,pwrite64',
        '-e',
        'inject=write,pwrite64:delay_enter=700000',
        process.execPath,
        BIN,
        'agent',
        'list',
      ],
      {env, extendEnv: false, reject: false},
    )
    try {
      for (
        const deadline = Date.now() + 60_000;
        !fs.existsSync(config);
        await new Promise((resolve) => setTimeout(resolve, 2))
      ) {
        if (Date.now() > deadline || slow.exitCode !== null)
          throw new Error(`the first command made no config: ${(await slow).stderr}`)
      }
      expect(fs.readFileSync(config, 'utf8')).toMatch(/agents:/) // whole as soon as it has its name
      const meanwhile = await execa(process.execPath, [BIN, 'agent', 'list'], {env, extendEnv: false, reject: false})
      expect(meanwhile.exitCode, meanwhile.stderr).toBe(0)
      expect((await slow).exitCode).toBe(0)
      expect(fs.readdirSync(home).filter((name) => name.endsWith('.tmp'))).toEqual([])
    } finally {
      slow.kill('SIGKILL')
      fs.rmSync(root, {recursive: true, force: true})
    }
  },
)
