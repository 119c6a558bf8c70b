import http from 'node:http'
import {afterEach, describe, expect, it} from 'vitest'
import {assertSafeBind, hasCaptainPassword, isLoopbackBind} from '../../../src/runtime/captain/index.js'
import {CaptainAuthStore} from '../../../src/runtime/captain/auth-store.js'
import {PasswordGuard} from '../../../src/runtime/captain/rate-limit.js'
import {verifyPassword} from '../../../src/runtime/captain/passwords.js'
import {AuditLog} from '../../../src/runtime/state/audit.js'
import {ApiKeys} from '../../../src/runtime/state/api-keys.js'
import {PASSWORD, sessionHeaders, startCaptain, type CaptainHarness} from './helpers.js'

describe('captain auth', () => {
  let harness: CaptainHarness | undefined
  afterEach(async () => {
    await harness?.close()
    harness = undefined
  })

  it('refuses a wrong password and returns a bearer session token in the body, never a cookie', async () => {
    harness = await startCaptain()
    const wrong = await harness.request('POST', '/api/captain/auth/login', {body: {password: 'nope nope nope'}})
    expect(wrong.status).toBe(401)
    const right = await harness.request('POST', '/api/captain/auth/login', {body: {password: PASSWORD}})
    expect(right.status).toBe(200)
    expect(right.headers.get('set-cookie')).toBeNull()
    expect(right.body.token).toMatch(/^cps_[A-Za-z0-9_-]{40,}$/)
    expect(right.body.csrf_token).toBeUndefined()
  })

  it('stores the password only as a salted scrypt hash', async () => {
    harness = await startCaptain()
    const stored = new CaptainAuthStore(harness.db).passwordHash() ?? ''
    expect(stored).toMatch(/^scrypt\$32768\$8\$1\$/)
    expect(stored).not.toContain(PASSWORD)
    const session = await harness.login()
    expect(new CaptainAuthStore(harness.db).passwordHash()).toBe(stored)
    expect((await harness.request('GET', '/api/captain/agents', {headers: sessionHeaders(session)})).status).toBe(200)
  })

  it('answers 401 without credentials, with a forged token, and to cookies or HTTP auth however valid', async () => {
    harness = await startCaptain()
    expect((await harness.request('GET', '/api/captain/agents')).status).toBe(401)
    expect((await harness.request('GET', '/api/captain/container/config')).status).toBe(401)
    const forged = await harness.request('GET', '/api/captain/agents', {
      headers: {authorization: 'Bearer cps_AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA'},
    })
    expect(forged.status).toBe(401)
    expect(forged.body.error.code).toBe('E_AUTH')
    // an attacker holding every cookie of the operator's browser, and the session token itself as a
    // cookie or Basic auth
    const {token} = await harness.login()
    const ambient: Array<Record<string, string>> = [
      {cookie: `captain_session=${token}`},
      {cookie: `captain_session=${token}; cps=${token}; token=${token}`},
      {authorization: `Basic ${Buffer.from(`admin:${PASSWORD}`).toString('base64')}`},
      {authorization: `Basic ${Buffer.from(`${token}:`).toString('base64')}`},
    ]
    for (const headers of ambient) {
      for (const [method, path, body] of [
        ['GET', '/api/captain/agents', undefined],
        ['GET', '/api/captain/agents/meepa', undefined],
        ['PATCH', '/api/captain/agents/meepa', {file_access: {unrestricted: true}}],
        ['GET', '/api/captain/agents/meepa/soul', undefined],
        ['PUT', '/api/captain/agents/meepa/soul', {content: 'owned'}],
        ['GET', '/api/captain/runs', undefined],
        ['GET', '/api/captain/auth/api-keys', undefined],
        ['POST', '/api/captain/auth/api-keys', {name: 'stolen', admin: true}],
        ['DELETE', '/api/captain/auth/api-keys/key_000000000000', undefined],
        ['POST', '/api/captain/auth/password', {current_password: PASSWORD, new_password: 'attacker password'}],
        ['GET', '/api/captain/container/config', undefined],
        ['PUT', '/api/captain/container/config', {redact_secrets: false}],
        ['GET', '/api/captain/container/dockerfile', undefined],
        ['GET', '/api/captain/container/status', undefined],
        ['POST', '/api/captain/container/build', {}],
        ['GET', '/api/captain/container/build/build_000000000000', undefined],
        ['GET', '/api/captain/container/build/build_000000000000/events', undefined],
        ['DELETE', '/api/captain/container/images/meepa-sandbox%3Aabc', undefined],
      ] as const) {
        const res = await harness.request(method, path, {body, headers})
        expect(res.status, `${method} ${path} with ${Object.keys(headers)[0]}`).toBe(401)
      }
    }
    expect(
      (await harness.request('GET', '/api/captain/auth/session', {headers: {cookie: `captain_session=${token}`}})).body
        .authenticated,
    ).toBe(false)
    expect(harness.loaded.config.agents[0]!.file_access.unrestricted).toBe(false)
  })

  it('logout ends the session token', async () => {
    harness = await startCaptain()
    const session = await harness.login()
    expect((await harness.request('GET', '/api/captain/agents', {headers: sessionHeaders(session)})).status).toBe(200)
    expect((await harness.request('POST', '/api/captain/auth/logout', {headers: sessionHeaders(session)})).status).toBe(
      200,
    )
    expect((await harness.request('GET', '/api/captain/agents', {headers: sessionHeaders(session)})).status).toBe(401)
  })

  it('a chat key may chat and nothing else; an admin key administers; neither changes the password', async () => {
    harness = await startCaptain()
    const keys = new ApiKeys(harness.db)
    const chatKey = {authorization: `Bearer ${keys.create('widget').key}`}
    const adminKey = {authorization: `Bearer ${keys.create('deploy', 'admin').key}`}
    for (const [method, path, body] of [
      ['GET', '/api/captain/agents', undefined],
      ['PATCH', '/api/captain/agents/meepa', {file_access: {unrestricted: true}}],
      ['PUT', '/api/captain/agents/meepa/soul', {content: 'owned'}],
      ['POST', '/api/captain/auth/api-keys', {name: 'more', admin: true}],
      ['DELETE', '/api/captain/auth/api-keys/key_000000000000', undefined],
      ['PUT', '/api/captain/container/config', {redact_secrets: false}],
      ['POST', '/api/captain/container/build', {}],
      ['GET', '/api/captain/runs', undefined],
    ] as const) {
      const res = await harness.request(method, path, {body, headers: chatKey})
      expect(res.status, `${method} ${path}`).toBe(403)
      expect(res.body.error.message).toContain('chat key')
    }
    expect((await harness.request('GET', '/api/captain/agents', {headers: adminKey})).status).toBe(200)
    const put = await harness.request('PUT', '/api/captain/agents/meepa/soul', {
      body: {content: 'from a script'},
      headers: adminKey,
    })
    expect(put.status).toBe(200)
    for (const headers of [chatKey, adminKey]) {
      const change = await harness.request('POST', '/api/captain/auth/password', {
        body: {current_password: PASSWORD, new_password: 'attacker password'},
        headers,
      })
      expect(change.status).toBe(403)
    }
    expect((await harness.request('POST', '/api/captain/auth/login', {body: {password: PASSWORD}})).status).toBe(200)
  })

  it('refuses revoked keys, and a bad key even with a valid session alongside in a cookie', async () => {
    harness = await startCaptain()
    const key = new ApiKeys(harness.db).create('script', 'admin')
    const bearer = {authorization: `Bearer ${key.key}`}
    expect((await harness.request('GET', '/api/captain/agents', {headers: bearer})).status).toBe(200)
    new ApiKeys(harness.db).revoke(key.id)
    const revoked = await harness.request('GET', '/api/captain/agents', {headers: bearer})
    expect(revoked.status).toBe(401)
    expect(revoked.body.error.message).toContain('revoked')
    const session = await harness.login()
    expect(
      (
        await harness.request('GET', '/api/captain/agents', {
          headers: {...bearer, cookie: `captain_session=${session.token}`},
        })
      ).status,
    ).toBe(401)
  })

  it('creates keys that are shown once, lists them by prefix, and revokes them from the API', async () => {
    harness = await startCaptain()
    const headers = sessionHeaders(await harness.login())
    const created = await harness.request('POST', '/api/captain/auth/api-keys', {
      body: {name: 'ci', admin: true},
      headers,
    })
    expect(created.status).toBe(201)
    expect(created.body.kind).toBe('admin')
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
      expect(
        (await harness.request('POST', '/api/captain/auth/login', {body: {password: `guess-${attempt}`}})).status,
      ).toBe(401)
    }
    const limited = await harness.request('POST', '/api/captain/auth/login', {body: {password: PASSWORD}})
    expect(limited.status).toBe(429)
    expect(Number(limited.headers.get('retry-after'))).toBeGreaterThan(0)
    expect(limited.body.error.message).toContain('dashboard link')
  })

  it('counts 30 parallel guesses before checking any: only 5 are checked', async () => {
    harness = await startCaptain()
    const answers = await Promise.all(
      Array.from({length: 30}, (_, index) =>
        harness!.request('POST', '/api/captain/auth/login', {body: {password: `parallel-${index}`}}),
      ),
    )
    const statuses = answers.map((answer) => answer.status)
    expect(statuses.filter((status) => status === 401)).toHaveLength(5)
    // and from 20 other loopback addresses: the global cap holds (20 guesses a minute in all)
    const fromAddress = (address: string) =>
      new Promise<number>((resolve, reject) => {
        const url = new URL(harness!.url)
        const req = http.request(
          {
            host: url.hostname,
            port: url.port,
            path: '/api/captain/auth/login',
            method: 'POST',
            localAddress: address,
            headers: {'content-type': 'application/json'},
          },
          (res) => {
            res.resume()
            resolve(res.statusCode ?? 0)
          },
        )
        req.on('error', reject)
        req.end(JSON.stringify({password: `from ${address}`}))
      })
    const spread = await Promise.all(Array.from({length: 20}, (_, index) => fromAddress(`127.0.0.${index + 2}`)))
    expect(spread.filter((status) => status === 401)).toHaveLength(15)
    expect(spread.filter((status) => status === 429)).toHaveLength(5)
    expect(statuses.filter((status) => status === 429)).toHaveLength(25)
    const audit = new AuditLog(harness.db).list()
    // every wrong guess is on the record; the 30 refused ones make one line with their count, not a flood
    const failed = audit.filter((entry) => entry.event === 'login_failed')
    expect(failed.filter((entry) => !entry.summary.includes('refused'))).toHaveLength(20)
    expect(failed.filter((entry) => entry.summary.includes('refused'))).toHaveLength(1)
    expect(harness.logs.filter((line) => line.includes('refused: too many attempts'))).toHaveLength(1)
  })

  it('the limiter counts attempts before they are checked, gives back right ones, and caps all addresses together', () => {
    let now = 0
    const guard = new PasswordGuard({perClient: 2, perClientWindowMs: 1000, global: 3, globalWindowMs: 1000}, () => now)
    const first = guard.begin('a')
    expect(first.ok).toBe(true)
    expect(guard.begin('a').ok).toBe(true)
    expect(guard.begin('a')).toMatchObject({ok: false}) // both still in flight: counted already
    if (first.ok) first.succeeded()
    expect(guard.begin('a').ok).toBe(true)
    // another address (127.0.0.2, 127.0.0.3) gets no fresh global budget
    expect(guard.begin('b').ok).toBe(true)
    expect(guard.begin('c')).toMatchObject({ok: false})
    now = 1001
    expect(guard.begin('c').ok).toBe(true)
  })

  it('answers 415 to login, setup and password requests that are not application/json, before counting or checking', async () => {
    harness = await startCaptain()
    for (const path of [
      '/api/captain/auth/login',
      '/api/captain/auth/setup',
      '/api/captain/auth/password',
      '/api/captain/auth/link',
    ]) {
      for (const type of [
        undefined,
        'text/plain',
        'application/x-www-form-urlencoded',
        'multipart/form-data; boundary=x',
      ]) {
        const res = await fetch(harness.url + path, {
          method: 'POST',
          headers: type ? {'content-type': type} : {},
          body: JSON.stringify({password: PASSWORD}),
        })
        // the password route needs a session first (401); the others refuse the type
        expect(res.status, `${path} ${type}`).toBe(path.endsWith('/password') ? 401 : 415)
      }
    }
    const session = await harness.login()
    const res = await fetch(harness.url + '/api/captain/auth/password', {
      method: 'POST',
      headers: {...sessionHeaders(session), 'content-type': 'text/plain'},
      body: '{}',
    })
    expect(res.status).toBe(415)
    expect(new AuditLog(harness.db).list().filter((entry) => entry.event === 'login_failed')).toHaveLength(0)
  })

  it('a password change needs the current password, is audited, and is not saved when rate-limited', async () => {
    harness = await startCaptain({env: {MEEPAGATEWAY_PASSWORD: ''}})
    await harness.request('POST', '/api/captain/auth/setup', {
      body: {code: harness.captain.setupCode, password: 'first password'},
    })
    const {body} = await harness.request('POST', '/api/captain/auth/login', {body: {password: 'first password'}})
    const headers = sessionHeaders({token: body.token})
    for (let attempt = 0; attempt < 5; attempt++) {
      expect(
        (
          await harness.request('POST', '/api/captain/auth/password', {
            body: {current_password: `wrong-${attempt}`, new_password: 'second password'},
            headers,
          })
        ).status,
      ).toBe(401)
    }
    const limited = await harness.request('POST', '/api/captain/auth/password', {
      body: {current_password: 'first password', new_password: 'third password'},
      headers,
    })
    expect(limited.status).toBe(429)
    const store = new CaptainAuthStore(harness.db)
    expect(await verifyPassword('first password', store.passwordHash()!)).toBe(true)
    const events = new AuditLog(harness.db).list().map((entry) => entry.event)
    expect(events).toContain('password_set')
    expect(events.filter((event) => event === 'password_change_failed')).toHaveLength(6)
  })

  it('a one-time dashboard link logs in once, even while password logins are locked out', async () => {
    harness = await startCaptain()
    const answers = await Promise.all(
      Array.from({length: 25}, (_, index) =>
        harness!.request('POST', '/api/captain/auth/login', {body: {password: `neighbour-${index}`}}),
      ),
    )
    expect(answers.some((answer) => answer.status === 429)).toBe(true)
    expect((await harness.request('POST', '/api/captain/auth/login', {body: {password: PASSWORD}})).status).toBe(429)
    const secret = new CaptainAuthStore(harness.db).createLoginLink()
    const used = await harness.request('POST', '/api/captain/auth/link', {body: {secret}})
    expect(used.status).toBe(200)
    expect((await harness.request('GET', '/api/captain/agents', {headers: sessionHeaders(used.body)})).status).toBe(200)
    expect((await harness.request('POST', '/api/captain/auth/link', {body: {secret}})).status).toBe(401)
    for (let attempt = 0; attempt < 30; attempt++) {
      expect(
        (await harness.request('POST', '/api/captain/auth/link', {body: {secret: `guess-${attempt}`}})).status,
      ).toBe(401)
    }
    // the link works whatever a neighbour did; its guesses are one audit line, not thirty
    expect(harness.logs.filter((line) => line.includes('unknown, used or expired link'))).toHaveLength(1)
    const another = new CaptainAuthStore(harness.db).createLoginLink()
    expect((await harness.request('POST', '/api/captain/auth/link', {body: {secret: another}})).status).toBe(200)
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
    expect(
      (await harness.request('POST', '/api/captain/auth/login', {body: {password: 'anything at all'}})).status,
    ).toBe(409)
    expect(
      (
        await harness.request('POST', '/api/captain/auth/setup', {
          body: {code: 'AAA-AAA-AAA', password: 'a good password'},
        })
      ).status,
    ).toBe(401)
    expect((await harness.request('POST', '/api/captain/auth/setup', {body: {code, password: 'short'}})).status).toBe(
      400,
    )
    const done = await harness.request('POST', '/api/captain/auth/setup', {
      body: {code: code.toLowerCase(), password: 'a good password'},
    })
    expect(done.status).toBe(200)
    expect(done.body.token).toMatch(/^cps_/)
    expect(hasCaptainPassword(harness.db, {})).toBe(true)
    // the code is spent
    expect(
      (await harness.request('POST', '/api/captain/auth/setup', {body: {code, password: 'another password'}})).status,
    ).toBe(409)
    expect(
      (await harness.request('POST', '/api/captain/auth/login', {body: {password: 'a good password'}})).status,
    ).toBe(200)
  })

  it('a password change ends every other session', async () => {
    harness = await startCaptain({env: {MEEPAGATEWAY_PASSWORD: ''}})
    await harness.request('POST', '/api/captain/auth/setup', {
      body: {code: harness.captain.setupCode, password: 'first password'},
    })
    const login = async (password: string) => {
      const res = await harness!.request('POST', '/api/captain/auth/login', {body: {password}})
      return {token: res.body.token as string}
    }
    const laptop = await login('first password')
    const phone = await login('first password')
    const changed = await harness.request('POST', '/api/captain/auth/password', {
      body: {current_password: 'first password', new_password: 'second password'},
      headers: sessionHeaders(laptop),
    })
    expect(changed.status).toBe(200)
    expect((await harness.request('GET', '/api/captain/agents', {headers: sessionHeaders(phone)})).status).toBe(401)
    expect((await harness.request('GET', '/api/captain/agents', {headers: sessionHeaders(changed.body)})).status).toBe(
      200,
    )
    expect(
      (await harness.request('POST', '/api/captain/auth/login', {body: {password: 'first password'}})).status,
    ).toBe(401)
  })
})

describe('serve bind safety', () => {
  it('knows loopback addresses', () => {
    for (const bind of ['127.0.0.1', '127.1.2.3', '::1', '[::1]', 'localhost', '::ffff:127.0.0.1'])
      expect(isLoopbackBind(bind), bind).toBe(true)
    for (const bind of ['0.0.0.0', '::', '10.0.0.5', '192.168.1.2', 'example.com', '::ffff:10.0.0.1'])
      expect(isLoopbackBind(bind), bind).toBe(false)
  })

  it('refuses a non-loopback bind without a password, and allows it with one', () => {
    expect(() => assertSafeBind('0.0.0.0', false)).toThrow(/refusing to serve the dashboard on 0\.0\.0\.0/)
    expect(() => assertSafeBind('0.0.0.0', true)).not.toThrow()
    expect(() => assertSafeBind('127.0.0.1', false)).not.toThrow()
  })
})
