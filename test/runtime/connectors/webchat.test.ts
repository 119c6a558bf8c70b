import {afterEach, describe, expect, it} from 'vitest'
import {RunRecords} from '../../../src/runtime/state/run-records.js'
import {ApiKeys} from '../../../src/runtime/state/api-keys.js'
import {startTestGateway, stubRun, type TestGateway} from '../gateway/helpers.js'

let test: TestGateway | undefined
afterEach(async () => {
  await test?.close()
  test = undefined
})

describe('HTTP listener and web chat', () => {
  it('answers /healthz without a key', async () => {
    test = await startTestGateway({agents: [{id: 'a1'}], run: stubRun()})
    const response = await fetch(`${test.gateway.url}/healthz`)
    expect(response.status).toBe(200)
    expect(await response.json()).toMatchObject({status: 'ok', agents: 1, runs: {running: 0, waiting: 0}})
  })

  it('runs a message through the agent and returns the reply and run id, recorded in gateway.db', async () => {
    test = await startTestGateway({agents: [{id: 'a1'}], run: stubRun()})
    const {status, body} = await test.chat({agent: 'a1', message: 'hello'})
    expect(status).toBe(200)
    expect(body.reply).toBe('echo: hello')
    expect(body.run_id).toMatch(/^run_/)
    expect(new RunRecords(test.gateway.db).get(body.run_id)).toMatchObject({
      agent_id: 'a1',
      connector: 'webchat',
      status: 'ok',
      input_tokens: 1,
    })
  })

  it('refuses a missing, unknown or revoked key with 401', async () => {
    test = await startTestGateway({agents: [{id: 'a1'}], run: stubRun()})
    expect((await test.chat({agent: 'a1', message: 'x'}, '')).status).toBe(401)
    expect((await test.chat({agent: 'a1', message: 'x'}, 'cptn_unknown')).status).toBe(401)
    const keys = new ApiKeys(test.gateway.db)
    const key = keys.create('temp')
    expect((await test.chat({agent: 'a1', message: 'x'}, key.key)).status).toBe(200)
    keys.revoke(key.id)
    const revoked = await test.chat({agent: 'a1', message: 'x'}, key.key)
    expect(revoked.status).toBe(401)
    expect(revoked.body.error.message).toMatch(/unknown or revoked/)
  })

  it('names the problem with bad input', async () => {
    test = await startTestGateway({agents: [{id: 'a1'}], run: stubRun()})
    expect(await test.chat({message: 'x'})).toMatchObject({
      status: 400,
      body: {error: {message: expect.stringMatching(/"agent"/)}},
    })
    expect(await test.chat({agent: 'a1', message: ''})).toMatchObject({status: 400})
    expect(await test.chat({agent: 'nobody', message: 'x'})).toMatchObject({
      status: 404,
      body: {error: {message: 'unknown agent "nobody"'}},
    })
    const notJson = await fetch(`${test.gateway.url}/api/chat`, {
      method: 'POST',
      headers: {authorization: `Bearer ${test.apiKey}`, 'content-type': 'application/json'},
      body: '{oops',
    })
    expect(notJson.status).toBe(400)
    expect((await fetch(`${test.gateway.url}/api/chat`)).status).toBe(405)
    expect((await fetch(`${test.gateway.url}/nothing-here`)).status).toBe(404)
  })

  it('answers a failed run with a short reply, 502 and the error code; the record has the full message', async () => {
    test = await startTestGateway({
      agents: [{id: 'a1'}],
      run: async ({runId}) => ({
        runId,
        level: 'host-sandbox',
        ms: 1,
        output: {
          version: 1,
          ok: false,
          run_id: runId,
          error: {code: 'E_PROVIDER', message: 'anthropic: 529 overloaded; openai: ECONNREFUSED', retryable: true},
        },
      }),
    })
    const {status, body} = await test.chat({agent: 'a1', message: 'hi'})
    expect(status).toBe(502)
    expect(body.error.code).toBe('E_PROVIDER')
    expect(body.reply).toMatch(/can't reach my language model/)
    expect(body.reply).not.toMatch(/ECONNREFUSED/)
    expect(new RunRecords(test.gateway.db).get(body.run_id)).toMatchObject({
      status: 'failed',
      error_code: 'E_PROVIDER',
      error_message: expect.stringMatching(/ECONNREFUSED/),
      isolation: 'host-sandbox',
    })
    // the caller's own run list has the code too, but the details stay the operator's, as in the reply
    const runs = (await (
      await fetch(`${test.gateway.url}/api/chat/runs`, {headers: {authorization: `Bearer ${test.apiKey}`}})
    ).json()) as Array<Record<string, unknown>>
    expect(runs).toMatchObject([{id: body.run_id, status: 'failed', error_code: 'E_PROVIDER'}])
    expect(JSON.stringify(runs)).not.toMatch(/ECONNREFUSED|overloaded/) // (ids and times may hold any digits)
  })

  it('lets other parts of the gateway mount routes on the same listener', async () => {
    test = await startTestGateway({agents: [{id: 'a1'}], run: stubRun()})
    // (the dashboard itself owns /api/captain/*; a route added later must not shadow or be shadowed)
    test.gateway.router.get('/api/extra/*', ({res, params}) => void res.end(`extra ${params['*']}`))
    expect(await (await fetch(`${test.gateway.url}/api/extra/agents/a1`)).text()).toBe('extra agents/a1')
  })
})
