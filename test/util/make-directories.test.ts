import {execa} from 'execa'
import fs from 'node:fs'
import os from 'node:os'
import path from 'node:path'
import {expect, it} from 'vitest'
import {makeDirectories} from '../../src/runtime/util/make-directories.js'
import {BIN} from '../helpers/home.js'

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

it.skipIf(!fs.existsSync('/proc/self'))('a MEEPAGATEWAY_HOME that cannot be made: each command says so and what to do, at once', async () => {
  for (const argv of [['config', 'check'], ['runs'], ['serve'], ['send', '--agent', 'a', 'hi']]) {
    const result = await execa(process.execPath, [BIN, ...argv], {env: {PATH: process.env.PATH, MEEPAGATEWAY_HOME: '/proc/meepa-no-such-home'}, extendEnv: false, reject: false, timeout: 20_000})
    expect(result.timedOut, argv.join(' ')).toBe(false)
    expect(result.exitCode, argv.join(' ')).not.toBe(0)
    expect(result.stderr, argv.join(' ')).toMatch(/\/proc\/meepa-no-such-home/)
  }
  const check = await execa(process.execPath, [BIN, 'config', 'check'], {env: {PATH: process.env.PATH, MEEPAGATEWAY_HOME: '/proc/meepa-no-such-home'}, extendEnv: false, reject: false})
  expect(check.stderr).toMatch(/MEEPAGATEWAY_HOME/)
})
