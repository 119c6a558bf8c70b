import {execFileSync} from 'node:child_process'
import crypto from 'node:crypto'
import fs from 'node:fs'
import os from 'node:os'
import path from 'node:path'
import {execa} from 'execa'
import {afterAll, describe, expect, it} from 'vitest'
import {homeLabel} from '../../../src/sandbox/docker/home-label.js'

/*
 * The home label: what tells one gateway home's objects on an engine from another's. Each home
 * keeps a random install-id, so two homes whose paths are the same (two machines sharing an
 * engine) never take each other's objects for their own; a home that already has volumes named
 * after its path alone keeps that name.
 */

const root = fs.mkdtempSync(path.join(os.tmpdir(), 'meepa-home-label-'))
const hash = (text: string) => crypto.createHash('sha256').update(text).digest('hex').slice(0, 16)
const newHome = () => fs.mkdtempSync(path.join(root, 'home-'))

describe('the home label', () => {
  afterAll(() => fs.rmSync(root, {recursive: true, force: true}))

  it('a new home makes a random id of its own, kept private, and is labelled by its path and that id', () => {
    const home = newHome()
    const label = homeLabel(home)
    const file = path.join(home, 'install-id')
    const id = fs.readFileSync(file, 'utf8').trim()
    expect(id).toMatch(/^[0-9a-f]{32}$/)
    expect(fs.statSync(file).mode & 0o777).toBe(0o600)
    expect(label).toBe(hash(`${fs.realpathSync(home)}\n${id}`))
    expect(label).not.toBe(hash(fs.realpathSync(home)))
    expect(homeLabel(`${home}/`)).toBe(label)
    // another new home: another id
    const other = newHome()
    homeLabel(other)
    expect(fs.readFileSync(path.join(other, 'install-id'), 'utf8').trim()).not.toBe(id)
  })

  it('the same path with another id (another machine’s home) has another label: read by a process of its own', async () => {
    const home = newHome()
    const read = async () =>
      (
        await execa(process.execPath, [
          '--import',
          'tsx',
          '-e',
          `import {homeLabel} from ${JSON.stringify(path.resolve('src/sandbox/docker/home-label.ts'))}; console.log(homeLabel(${JSON.stringify(home)}))`,
        ])
      ).stdout.trim()
    const first = await read()
    expect(await read()).toBe(first)
    fs.writeFileSync(path.join(home, 'install-id'), `${'0'.repeat(32)}\n`)
    const second = await read()
    expect(second).not.toBe(first)
    expect(second).toBe(hash(`${fs.realpathSync(home)}\n${'0'.repeat(32)}`))
  }, 60_000)

  it('a home that already has volumes on engines keeps the label of its path, and says so in install-id', () => {
    const home = newHome()
    fs.mkdirSync(path.join(home, 'cache', 'engine-sync', 'remote'), {recursive: true})
    fs.writeFileSync(path.join(home, 'cache', 'engine-sync', 'remote', 'far.json'), '{}')
    expect(homeLabel(home)).toBe(hash(fs.realpathSync(home)))
    expect(fs.readFileSync(path.join(home, 'install-id'), 'utf8')).toBe('path\n')
    // an engine folder left empty (its volumes cleaned) holds none
    const cleaned = newHome()
    fs.mkdirSync(path.join(cleaned, 'cache', 'engine-sync', 'remote'), {recursive: true})
    expect(homeLabel(cleaned)).not.toBe(hash(fs.realpathSync(cleaned)))
  })

  it('a home that does not exist yet is labelled by its path, and nothing is made there', () => {
    const home = path.join(root, 'not-yet')
    expect(homeLabel(home)).toBe(hash(path.resolve(home)))
    expect(fs.existsSync(home)).toBe(false)
  })

  it('an install-id that is a link, a FIFO or empty is refused, naming the file: never labelled by its path', () => {
    const linked = newHome()
    fs.writeFileSync(path.join(root, 'elsewhere'), `${'1'.repeat(32)}\n`)
    fs.symlinkSync(path.join(root, 'elsewhere'), path.join(linked, 'install-id'))
    expect(() => homeLabel(linked)).toThrow(`cannot use ${path.join(linked, 'install-id')}`)
    expect(() => homeLabel(linked)).toThrow(/it is not a regular file/)
    const fifo = newHome()
    execFileSync('mkfifo', [path.join(fifo, 'install-id')])
    expect(() => homeLabel(fifo)).toThrow(/it is not a regular file/)
    const empty = newHome()
    fs.writeFileSync(path.join(empty, 'install-id'), '\n')
    expect(() => homeLabel(empty)).toThrow(/it is empty/)
  })

  it('a home that only has disk image records, or records in several engines, keeps its path label too', () => {
    const home = newHome()
    fs.mkdirSync(path.join(home, 'cache', 'engine-sync', 'a'), {recursive: true})
    fs.mkdirSync(path.join(home, 'cache', 'engine-sync', 'b'), {recursive: true})
    fs.writeFileSync(path.join(home, 'cache', 'engine-sync', 'b', 'far.disk.json'), '{}')
    expect(homeLabel(home)).toBe(hash(fs.realpathSync(home)))
  })

  it('two processes making the id at once both get the one put in place first', async () => {
    const home = newHome()
    const script = `import {homeLabel} from ${JSON.stringify(path.resolve('src/sandbox/docker/home-label.ts'))}; console.log(homeLabel(${JSON.stringify(home)}))`
    const labels = await Promise.all(
      Array.from({length: 4}, async () =>
        (await execa(process.execPath, ['--import', 'tsx', '-e', script])).stdout.trim(),
      ),
    )
    expect(new Set(labels).size).toBe(1)
    const id = fs.readFileSync(path.join(home, 'install-id'), 'utf8').trim()
    expect(labels[0]).toBe(hash(`${fs.realpathSync(home)}\n${id}`))
    expect(fs.readdirSync(home)).toEqual(['install-id'])
  }, 60_000)
})
