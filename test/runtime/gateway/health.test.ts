import {describe, expect, it} from 'vitest'
import {startFakeDiscord} from '../../fakes/discord-server.js'
import {startFakeMeepaChat, type FakeMeepaChat} from '../../fakes/meepachat-server.js'
import {startFakeSlack} from '../../fakes/slack-server.js'
import {waitFor} from '../../helpers/wait-for.js'
import {closeAfterEachTest, startTestGateway, stubRun, type TestGateway} from './helpers.js'

/*
 * Issue 28, criterion 5: /healthz says `degraded`, naming each connector that is not connected
 * (reconnecting, or refused by its platform), without waiting for a message, and ok again once
 * it is connected. Faults are injected into the platforms' wire fakes (MeepaChat, Slack, Discord).
 */

const TOKEN = '11.meepa-secret'
const closeAfterTest = closeAfterEachTest()

async function healthz(test: TestGateway): Promise<{status: number; body: {status: string; reasons?: string[]}}> {
  const response = await fetch(`${test.gateway.url}/healthz`)
  return {status: response.status, body: (await response.json()) as {status: string; reasons?: string[]}}
}

async function gatewayWith(connectors: Array<Record<string, unknown>>): Promise<TestGateway> {
  return closeAfterTest(await startTestGateway({agents: [{id: 'meepa', connectors}], run: stubRun()}))
}

describe('/healthz and the chat connectors', () => {
  it('a MeepaChat server that goes away: degraded naming the connector as reconnecting, ok again once it is back', async () => {
    let chat: FakeMeepaChat = await startFakeMeepaChat({token: TOKEN})
    const port = Number(new URL(chat.gatewayUrl).port)
    const test = await gatewayWith([{type: 'meepachat', url: chat.gatewayUrl, bot_token: TOKEN}])
    await chat.waitForReadyCount(1)
    await waitFor('/healthz ok while connected', async () => (await healthz(test)).status === 200)

    await chat.close() // the server is gone: connections are refused
    let health = await healthz(test)
    await waitFor('/healthz degraded', async () => (health = await healthz(test)).status === 503)
    expect(health.body.status).toBe('degraded')
    expect(health.body.reasons).toHaveLength(1)
    expect(health.body.reasons?.[0]).toMatch(
      /^connector meepa\/meepachat reconnecting: (connect ECONNREFUSED 127\.0\.0\.1:\d+|connection closed \(code 1006\)); next attempt at \d{4}-\d\d-\d\dT[\d:.]+Z$/,
    )

    chat = closeAfterTest(await startFakeMeepaChat({token: TOKEN, port}))
    await chat.waitForReadyCount(1, 10_000)
    await waitFor('/healthz ok once connected again', async () => (health = await healthz(test)).status === 200)
    expect(health.body).toMatchObject({status: 'ok'})
    expect(health.body.reasons).toBeUndefined()
  })

  it('platforms that refuse the bot token: degraded naming each such connector as refused and why; the connected one is not named', async () => {
    const chat = closeAfterTest(await startFakeMeepaChat({token: TOKEN}))
    const slack = closeAfterTest(await startFakeSlack({botToken: 'xoxb-1', appToken: 'xapp-1'}))
    const discord = closeAfterTest(await startFakeDiscord({token: 'bot.token'}))
    const test = await gatewayWith([
      {type: 'meepachat', url: chat.gatewayUrl, bot_token: TOKEN},
      {type: 'slack', bot_token: 'xoxb-wrong', app_token: 'xapp-1', api_url: slack.apiUrl},
      {type: 'discord', bot_token: 'bot.wrong', guild_ids: [], api_url: discord.apiUrl},
    ])
    await chat.waitForReadyCount(1)
    let health = await healthz(test)
    await waitFor(
      '/healthz to name both refusals',
      async () => (health = await healthz(test)).body.reasons?.length === 2,
    )
    expect(health.status).toBe(503)
    expect(health.body.reasons).toEqual([
      expect.stringMatching(
        /^connector meepa\/slack refused: Slack refused the token \(invalid_auth\); check bot_token and app_token; next attempt at \d{4}-\d\d-\d\dT[\d:.]+Z$/,
      ),
      expect.stringMatching(
        /^connector meepa\/discord refused: Discord refused the bot token \(TokenInvalid\); check bot_token; next attempt at \d{4}-\d\d-\d\dT[\d:.]+Z$/,
      ),
    ])
  })
})
