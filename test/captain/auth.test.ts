import {afterEach, describe, expect, it} from 'vitest'
import {assertSafeBind, hasCaptainPassword, isLoopbackBind} from '../../src/runtime/captain/index.js'
import {CaptainAuthStore} from '../../src/runtime/captain/auth-store.js'
import {FailureRateLimiter} from '../../src/runtime/captain/rate-limit.js'
import {ApiKeys} from '../../src/runtime/state/api-keys.js'
import {PASSWORD, sessionHeaders, startCaptain, type CaptainHarness} from './helpers.js'

describe('captain auth', () => {
  let harness: CaptainHarness | undefined
  afterEach(async () => {
    await harness?.close()
    harness = undefined
  })

  it('refuses a wrong password and sets an HttpOnly, SameSite=Strict session cookie for the right one', async () => {
    harness = await startCaptain()
    const wrong = await harness.request('POST', '/api/captain/auth/login', {body: {password: 'nope nope nope'}})
    expect(wrong.status).toBe(401)
    expect(wrong.headers.get('set-cookie')).toBeNull()
    const right = await harness.request('POST', '/api/captain/auth/login', {body: {password: PASSWORD}})
    expect(right.status).toBe(200)
    const cookie = right.headers.get('set-cookie') ?? ''
    expect(cookie).toMatch(/^captain_session=[A-Za-z0-9_-]{40,};/)
    expect(cookie).toContain('HttpOnly')
    expect(cookie).toContain('SameSite=Strict')
    expect(right.body.csrf_token).toMatch(/^[A-Za-z0-9_-]{20,}$/)
  })

  it('stores the password only as a salted scrypt hash', async () => {
    harness = await startCaptain()
    const stored = new CaptainAuthStore(harness.db).passwordHash() ?? ''
    expect(stored).toMatch(/^scrypt\$32768\$8\$1\$/)
    expect(stored).not.toContain(PASSWORD)
    const session = await harness.login()
    // a second gateway start with the same variable keeps the hash (and so the sessions)
    expect(new CaptainAuthStore(harness.db).passwordHash()).toBe(stored)
    expect((await harness.request('GET', '/api/captain/agents', {headers: sessionHeaders(session)})).status).toBe(200)
  })

  it('answers 401 to API requests without a session cookie, and with a forged one', async () => {
    harness = await startCaptain()
    expect((await harness.request('GET', '/api/captain/agents')).status).toBe(401)
    expect((await harness.request('GET', '/api/captain/container/config')).status).toBe(401)
    const forged = await harness.request('GET', '/api/captain/agents', {headers: {cookie: 'captain_session=AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA'}})
    expect(forged.status).toBe(401)
    expect(forged.body.error.code).toBe('E_AUTH')
  })

  it('refuses a state-changing cookie request without the CSRF token or with a wrong one', async () => {
    harness = await startCaptain()
    const session = await harness.login()
    const body = {content: '# changed\n'}
    const missing = await harness.request('PUT', '/api/captain/agents/meepa/soul', {body, headers: {cookie: session.cookie}})
    expect(missing.status).toBe(403)
    expect(missing.body.error.message).toContain('CSRF')
    const wrong = await harness.request('PUT', '/api/captain/agents/meepa/soul', {body, headers: {cookie: session.cookie, 'x-csrf-token': 'x'.repeat(32)}})
    expect(wrong.status).toBe(403)
    const soul = await harness.request('GET', '/api/captain/agents/meepa/soul', {headers: {cookie: session.cookie}})
    expect(soul.body.content).not.toBe('# changed\n')
    const right = await harness.request('PUT', '/api/captain/agents/meepa/soul', {body, headers: sessionHeaders(session)})
    expect(right.status).toBe(200)
  })

  it('accepts API keys as Bearer on dashboard routes without CSRF, and refuses them once revoked', async () => {
    harness = await startCaptain()
    const key = new ApiKeys(harness.db).create('script')
    const bearer = {authorization: `Bearer ${key.key}`}
    expect((await harness.request('GET', '/api/captain/agents', {headers: bearer})).status).toBe(200)
    const put = await harness.request('PUT', '/api/captain/agents/meepa/soul', {body: {content: 'from a script'}, headers: bearer})
    expect(put.status).toBe(200)
    new ApiKeys(harness.db).revoke(key.id)
    const revoked = await harness.request('GET', '/api/captain/agents', {headers: bearer})
    expect(revoked.status).toBe(401)
    expect(revoked.body.error.message).toContain('revoked')
    // a bad key is refused even when a valid session cookie rides along
    const session = await harness.login()
    expect((await harness.request('GET', '/api/captain/agents', {headers: {...bearer, cookie: session.cookie}})).status).toBe(401)
  })

  it('creates keys that are shown once, lists them by prefix, and revokes them from the API', async () => {
    harness = await startCaptain()
    const headers = sessionHeaders(await harness.login())
    const created = await harness.request('POST', '/api/captain/auth/api-keys', {body: {name: 'ci'}, headers})
    expect(created.status).toBe(201)
    expect(created.body.key).toMatch(/^cptn_/)
    const list = await harness.request('GET', '/api/captain/auth/api-keys', {headers})
    expect(list.body).toHaveLength(1)
    expect(JSON.stringify(list.body)).not.toContain(created.body.key)
    expect(created.body.key.startsWith(list.body[0].prefix)).toBe(true)
    const useKey = {authorization: `Bearer ${created.body.key}`}
    expect((await harness.request('GET', '/api/captain/runs', {headers: useKey})).status).toBe(200)
    const revoked = await harness.request('DELETE', `/api/captain/auth/api-keys/${created.body.id}`, {headers})
    expect(revoked.body.revoked).toBe(true)
    expect((await harness.request('GET', '/api/captain/runs', {headers: useKey})).status).toBe(401)
  })

  it('rate-limits failed logins per client: after 5 failures even the right password waits', async () => {
    harness = await startCaptain()
    for (let attempt = 0; attempt < 5; attempt++) {
      expect((await harness.request('POST', '/api/captain/auth/login', {body: {password: `guess-${attempt}`}})).status).toBe(401)
    }
    const limited = await harness.request('POST', '/api/captain/auth/login', {body: {password: PASSWORD}})
    expect(limited.status).toBe(429)
    expect(Number(limited.headers.get('retry-after'))).toBeGreaterThan(0)
  })

  it('the limiter forgets failures after its window', () => {
    let now = 0
    const limiter = new FailureRateLimiter(2, 1000, () => now)
    limiter.recordFailure('a')
    limiter.recordFailure('a')
    expect(limiter.retryAfterSeconds('a')).toBe(1)
    expect(limiter.retryAfterSeconds('b')).toBe(0)
    now = 1001
    expect(limiter.retryAfterSeconds('a')).toBe(0)
  })

  it('without a password prints a one-time setup code that sets it once', async () => {
    harness = await startCaptain({env: {MEEPAGATEWAY_PASSWORD: ''}})
    const code = harness.captain.setupCode as string
    expect(code).toMatch(/^[A-Z2-9]{3}-[A-Z2-9]{3}-[A-Z2-9]{3}$/)
    expect(harness.logs.join('\n')).toContain(code)
    expect(harness.logs.join('\n')).toContain(`open ${harness.url}/setup`) // the bound port, not the configured 0
    expect(hasCaptainPassword(harness.db, {})).toBe(false)
    const state = await harness.request('GET', '/api/captain/auth/session')
    expect(state.body).toMatchObject({authenticated: false, setup_required: true})
    expect((await harness.request('POST', '/api/captain/auth/login', {body: {password: 'anything at all'}})).status).toBe(409)
    expect((await harness.request('POST', '/api/captain/auth/setup', {body: {code: 'AAA-AAA-AAA', password: 'a good password'}})).status).toBe(401)
    expect((await harness.request('POST', '/api/captain/auth/setup', {body: {code, password: 'short'}})).status).toBe(400)
    const done = await harness.request('POST', '/api/captain/auth/setup', {body: {code: code.toLowerCase(), password: 'a good password'}})
    expect(done.status).toBe(200)
    expect(done.headers.get('set-cookie')).toContain('HttpOnly')
    expect(hasCaptainPassword(harness.db, {})).toBe(true)
    // the code is spent
    expect((await harness.request('POST', '/api/captain/auth/setup', {body: {code, password: 'another password'}})).status).toBe(409)
    expect((await harness.request('POST', '/api/captain/auth/login', {body: {password: 'a good password'}})).status).toBe(200)
  })

  it('a password change ends every other session', async () => {
    harness = await startCaptain({env: {MEEPAGATEWAY_PASSWORD: ''}})
    await harness.request('POST', '/api/captain/auth/setup', {body: {code: harness.captain.setupCode, password: 'first password'}})
    const login = async (password: string) => {
      const res = await harness!.request('POST', '/api/captain/auth/login', {body: {password}})
      return {cookie: (res.headers.get('set-cookie') ?? '').split(';')[0] as string, csrf: res.body.csrf_token as string}
    }
    const laptop = await login('first password')
    const phone = await login('first password')
    const changed = await harness.request('POST', '/api/captain/auth/password', {body: {current_password: 'first password', new_password: 'second password'}, headers: sessionHeaders(laptop)})
    expect(changed.status).toBe(200)
    expect((await harness.request('GET', '/api/captain/agents', {headers: {cookie: phone.cookie}})).status).toBe(401)
    const fresh = (changed.headers.get('set-cookie') ?? '').split(';')[0] as string
    expect((await harness.request('GET', '/api/captain/agents', {headers: {cookie: fresh}})).status).toBe(200)
    expect((await harness.request('POST', '/api/captain/auth/login', {body: {password: 'first password'}})).status).toBe(401)
  })
})

describe('serve bind safety', () => {
  it('knows loopback addresses', () => {
    for (const bind of ['127.0.0.1', '127.1.2.3', '::1', '[::1]', 'localhost', '::ffff:127.0.0.1']) expect(isLoopbackBind(bind), bind).toBe(true)
    for (const bind of ['0.0.0.0', '::', '10.0.0.5', '192.168.1.2', 'example.com', '::ffff:10.0.0.1']) expect(isLoopbackBind(bind), bind).toBe(false)
  })

  it('refuses a non-loopback bind without a password, and allows it with one', () => {
    expect(() => assertSafeBind('0.0.0.0', false)).toThrow(/refusing to serve the dashboard on 0\.0\.0\.0/)
    expect(() => assertSafeBind('0.0.0.0', true)).not.toThrow()
    expect(() => assertSafeBind('127.0.0.1', false)).not.toThrow()
  })
})
