import {describe, expect, it} from 'vitest'
import {anthropicBaseUrl} from '../../../src/runtime/providers/anthropic.js'
import {retryAfterMs} from '../../../src/runtime/providers/failure.js'
import {
  backoffDelayMs,
  DEFAULT_BASE_DELAY_MS,
  MAX_BACKOFF_MS,
  retryOptions,
} from '../../../src/runtime/providers/retry.js'

const headers = (values: Record<string, string>) => new Headers(values)

describe('backoff', () => {
  it('doubles each retry, with half of each step random, up to the ceiling', () => {
    const low = retryOptions({baseDelayMs: 200, random: () => 0})
    const high = retryOptions({baseDelayMs: 200, random: () => 1})
    expect([1, 2, 3].map((retry) => backoffDelayMs(retry, low))).toEqual([100, 200, 400])
    expect([1, 2, 3].map((retry) => backoffDelayMs(retry, high))).toEqual([200, 400, 800])
    expect(backoffDelayMs(30, high)).toBe(MAX_BACKOFF_MS)
  })

  it('never waits less than the server asked', () => {
    expect(backoffDelayMs(1, retryOptions({baseDelayMs: 200, random: () => 1}), 1500)).toBe(1500)
  })

  it('takes its base from MEEPA_RETRY_BASE_MS, so child processes in tests retry quickly', () => {
    expect(retryOptions({}, {MEEPA_RETRY_BASE_MS: '5'}).baseDelayMs).toBe(5)
    expect(retryOptions({}, {MEEPA_RETRY_BASE_MS: 'soon'}).baseDelayMs).toBe(DEFAULT_BASE_DELAY_MS)
    expect(retryOptions({}, {}).baseDelayMs).toBe(DEFAULT_BASE_DELAY_MS)
  })
})

describe('Retry-After', () => {
  it('reads retry-after-ms, seconds, and HTTP dates', () => {
    const now = Date.parse('2026-11-29T12:00:00Z')
    expect(retryAfterMs(headers({'retry-after-ms': '250'}), now)).toBe(250)
    expect(retryAfterMs(headers({'retry-after': '2'}), now)).toBe(2000)
    expect(retryAfterMs(headers({'retry-after': 'Sun, 29 Nov 2026 12:00:07 GMT'}), now)).toBe(7000)
    expect(retryAfterMs(headers({'retry-after': 'whenever'}), now)).toBeUndefined()
    expect(retryAfterMs(headers({}), now)).toBeUndefined()
  })
})

describe('anthropic base_url', () => {
  it('accepts an OpenAI-style URL ending in /v1 without doubling it', () => {
    expect(anthropicBaseUrl('http://127.0.0.1:8080/v1/')).toBe('http://127.0.0.1:8080')
    expect(anthropicBaseUrl('https://proxy.example/anthropic')).toBe('https://proxy.example/anthropic')
    expect(anthropicBaseUrl(undefined)).toBeUndefined()
  })
})
