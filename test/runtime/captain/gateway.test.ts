import {afterAll, afterEach, beforeAll, describe, expect, it} from 'vitest'
import {loadConfig} from '../../../src/runtime/config/load.js'
import {startGateway} from '../../../src/runtime/gateway/gateway.js'
import {startFakeLlm, type FakeLlm} from '../../fakes/llm-server.js'
import {startTestGateway, stubRun, type TestGateway} from '../gateway/helpers.js'
import {fakeLlmConfig, makeHome} from '../../helpers/home.js'

const PASSWORD = 'gateway test password'

// The dashboard as `serve` runs it: mounted on the gateway's listener, next to the web chat.
describe('captain inside the gateway', () => {
  let test: TestGateway | undefined
  let llm: FakeLlm
  beforeAll(async () => {
    process.env.MEEPAGATEWAY_PASSWORD = PASSWORD
    llm = await startFakeLlm()
  })
  afterAll(async () => {
    delete process.env.MEEPAGATEWAY_PASSWORD
    await llm.close()
  })
  afterEach(async () => {
    await test?.close()
    test = undefined
  })

  async function login(url: string): Promise<{token: string}> {
    const res = await fetch(`${url}/api/captain/auth/login`, {
      method: 'POST',
      headers: {'content-type': 'application/json'},
      body: JSON.stringify({password: PASSWORD}),
    })
    expect(res.status).toBe(200)
    return {token: ((await res.json()) as {token: string}).token}
  }

  const chat = (url: string, headers: Record<string, string>) =>
    fetch(`${url}/api/chat`, {
      method: 'POST',
      headers: {'content-type': 'application/json', ...headers},
      body: JSON.stringify({agent: 'a1', message: 'hi'}),
    })

  it('lets the dashboard use the web chat with its bearer session token, never with a cookie', async () => {
    test = await startTestGateway({agents: [{id: 'a1'}], run: stubRun()})
    const session = await login(test.gateway.url)
    expect((await chat(test.gateway.url, {cookie: `captain_session=${session.token}`})).status).toBe(401)
    expect((await chat(test.gateway.url, {})).status).toBe(401)
    const ok = await chat(test.gateway.url, {authorization: `Bearer ${session.token}`})
    expect(ok.status).toBe(200)
    expect(await ok.json()).toMatchObject({reply: 'echo: hi', tool_calls: []})
  })

  it('applies an agent change made in the dashboard to the next run, without a restart', async () => {
    llm.reset()
    test = await startTestGateway({agents: [{id: 'a1', max_iterations: 5}], llmBaseUrl: llm.openaiBaseUrl})
    const session = await login(test.gateway.url)
    const patch = await fetch(`${test.gateway.url}/api/captain/agents/a1`, {
      method: 'PATCH',
      headers: {'content-type': 'application/json', authorization: `Bearer ${session.token}`},
      body: JSON.stringify({max_iterations: 1}),
    })
    expect(patch.status).toBe(200)
    expect(((await patch.json()) as {applied: boolean}).applied).toBe(true)
    // the model keeps calling tools; with max_iterations 1 the loop must stop after one request
    llm.setDefault({toolCalls: [{name: 'list_files', arguments: {path: '.'}}]})
    const res = await test.chat({agent: 'a1', message: 'look around'})
    expect(res.status).toBe(200)
    expect(llm.requests).toHaveLength(1)
  })

  it('refuses to start on a non-loopback captain.bind while no password is set', async () => {
    delete process.env.MEEPAGATEWAY_PASSWORD
    const home = makeHome(
      fakeLlmConfig('http://127.0.0.1:9/v1', [{id: 'a1'}], {captain: {enabled: true, bind: '0.0.0.0', port: 0}}),
    )
    try {
      const loaded = loadConfig({home: home.home, env: {FAKE_LLM_KEY: 'x'}})
      await expect(startGateway({loaded, port: 0, log: () => {}})).rejects.toThrow(
        /refusing to serve the dashboard on 0\.0\.0\.0/,
      )
    } finally {
      process.env.MEEPAGATEWAY_PASSWORD = PASSWORD
      home.cleanup()
    }
  })
})
