import {describe, expect, it} from 'vitest'
import {asciiLocaleOrder, localeOrder} from '../../../src/runtime/util/locale-order.js'
import {seededRandom} from '../../helpers/seeded-random.js'

// The sandbox policy sorts its paths with localeOrder instead of localeCompare (ICU's collator
// costs ≈ 5 ms to build): the order must be localeCompare's exactly.

const PRINTABLE = Array.from({length: 95}, (_, i) => String.fromCharCode(32 + i)).join('')
const PATHISH = '/aAbBzZ09._-~ +@:'
const sign = (n: number) => Math.sign(n)

describe('localeOrder', () => {
  it('orders every pair of printable ASCII characters as localeCompare', () => {
    for (const a of PRINTABLE)
      for (const b of PRINTABLE) expect([a, b, sign(localeOrder(a, b))]).toEqual([a, b, sign(a.localeCompare(b))])
  })

  it('orders 200000 generated pairs as localeCompare: path-like, any printable, case pairs, prefixes, non-ASCII', () => {
    const rand = seededRandom(13)
    const text = (alphabet: string, max: number) =>
      Array.from({length: Math.floor(rand() * max)}, () => alphabet[Math.floor(rand() * alphabet.length)]).join('')
    for (let i = 0; i < 200_000; i++) {
      const alphabet = i % 3 === 0 ? PRINTABLE : i % 7 === 0 ? `${PATHISH}é\u0301\u0000ß` : PATHISH
      const a = text(alphabet, 12)
      const roll = rand()
      // b often shares a's start, differs in case only, or extends it
      const b =
        roll < 0.3
          ? a.slice(0, Math.floor(rand() * (a.length + 1))) + text(alphabet, 4)
          : roll < 0.45
            ? a.toUpperCase()
            : roll < 0.5
              ? a
              : text(alphabet, 12)
      if (sign(localeOrder(a, b)) !== sign(a.localeCompare(b)))
        expect({a, b, order: localeOrder(a, b)}).toEqual({a, b, order: a.localeCompare(b)})
    }
  })

  it('sorts paths as localeCompare does, and without ICU under en-US', () => {
    const paths = [
      '/etc/X11',
      '/etc/x11',
      '/etc/ssl',
      '/etc/ssl-x',
      '/etc/ssl/certs',
      '/etc/sslx',
      '/etc/ssl_x',
      '/etc/ssl.d',
      '/etc/SSL',
      '/etc',
      '/etc/a b',
      '/etc/~x',
      '/etc/1',
      '/etc/10',
      '/etc/9',
    ]
    expect([...paths].sort(localeOrder)).toEqual([...paths].sort((a, b) => a.localeCompare(b)))
    if (new Intl.PluralRules().resolvedOptions().locale === 'en-US')
      expect(asciiLocaleOrder('/etc/ssl', '/etc/ssl-x')).toBe(-1)
    expect(asciiLocaleOrder('/etc/é', '/etc/e')).toBeUndefined()
  })
})
