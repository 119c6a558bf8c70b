import {execaSync} from 'execa'
import fs from 'node:fs'
import os from 'node:os'
import path from 'node:path'
import {expect, it} from 'vitest'
import {isEmptyDirectory} from '../../../src/runtime/util/empty-directory.js'
import {readRegularFile} from '../../../src/runtime/util/regular-file.js'

it('reads a regular file, whole or its first bytes, and nothing through a link, a FIFO or a folder', () => {
  const root = fs.mkdtempSync(path.join(os.tmpdir(), 'meepa-regular-'))
  try {
    const secret = path.join(root, 'secret')
    fs.writeFileSync(secret, 'host secret')
    expect(readRegularFile(secret)?.toString()).toBe('host secret')
    expect(readRegularFile(secret, 4)?.toString()).toBe('host')
    expect(readRegularFile(secret, 100)?.toString()).toBe('host secret')
    fs.symlinkSync(secret, path.join(root, 'link'))
    expect(readRegularFile(path.join(root, 'link'))).toBeUndefined()
    // a FIFO with no writer would hold a blocking open() forever: here it answers at once
    execaSync('mkfifo', [path.join(root, 'fifo')])
    expect(readRegularFile(path.join(root, 'fifo'))).toBeUndefined()
    expect(readRegularFile(root)).toBeUndefined()
    expect(readRegularFile(path.join(root, 'missing'))).toBeUndefined()
  } finally {
    fs.rmSync(root, {recursive: true, force: true})
  }
})

it('tells an empty folder from one with an entry, and from anything that is not a folder', () => {
  const root = fs.mkdtempSync(path.join(os.tmpdir(), 'meepa-empty-'))
  try {
    expect(isEmptyDirectory(root)).toBe(true)
    fs.writeFileSync(path.join(root, 'file'), '')
    expect(isEmptyDirectory(root)).toBe(false)
    expect(isEmptyDirectory(path.join(root, 'file'))).toBe(false)
    expect(isEmptyDirectory(path.join(root, 'missing'))).toBe(false)
  } finally {
    fs.rmSync(root, {recursive: true, force: true})
  }
})
