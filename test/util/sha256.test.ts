import crypto from 'node:crypto'
import {expect, it} from 'vitest'
import {sha256, sha256Hash} from '../../src/runtime/util/sha256.js'
import {seededRandom} from '../helpers/seeded-random.js'

// Image tags, container labels and the app's hash are compared with what other builds and other
// processes computed with node:crypto: the JavaScript path must give the same digest.
const reference = (...parts: Array<string | Uint8Array>) => parts.reduce((hash, part) => hash.update(part), crypto.createHash('sha256')).digest('hex')

it('matches node:crypto at every padding boundary, past the switch to node:crypto, and for UTF-8 text', () => {
  const random = seededRandom(13)
  const bytes = (length: number) => Buffer.from(Array.from({length}, () => Math.floor(random() * 256)))
  for (const length of [0, 1, 3, 55, 56, 57, 63, 64, 65, 119, 120, 127, 128, 1000, 4095, 4096, 4097, 10_000]) {
    const input = bytes(length)
    expect(sha256(input), `${length} bytes`).toBe(reference(input))
  }
  // FIPS 180-2 appendix B
  expect(sha256('abc')).toBe('ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad')
  expect(sha256('')).toBe('e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855')
  for (const text of ['/home/ünïcødé/.meepagateway', 'emoji \u{1f600} and a lone \ud800 surrogate', 'x'.repeat(5000)]) expect(sha256(text)).toBe(reference(text))
})

it('hashes what update() was given in pieces as node:crypto does, including a view into a larger buffer', () => {
  const random = seededRandom(7)
  for (let round = 0; round < 200; round++) {
    const parts: Array<string | Uint8Array> = []
    for (let count = Math.floor(random() * 6); count > 0; count--) {
      const length = Math.floor(random() * (random() < 0.1 ? 3000 : 100))
      if (random() < 0.5) parts.push('é'.repeat(Math.floor(length / 2)))
      else {
        const backing = Buffer.from(Array.from({length: length + 16}, () => Math.floor(random() * 256)))
        parts.push(new Uint8Array(backing.buffer, backing.byteOffset + 8, length))
      }
    }
    const hash = parts.reduce((hash, part) => hash.update(part), sha256Hash())
    expect(hash.digest('hex'), `round ${round}`).toBe(reference(...parts))
  }
})

it('reads a buffer when it is given, as node:crypto does, and refuses a second digest', () => {
  const buffer = Buffer.from('hello world')
  const hash = sha256Hash().update(buffer)
  buffer.fill(0) // the caller reuses its buffer before the digest
  expect(hash.digest('hex')).toBe(reference('hello world'))
  expect(() => hash.digest('hex')).toThrow(/already/)
  expect(() => hash.update('more')).toThrow(/already/)
})
