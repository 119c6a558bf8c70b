import {beforeEach, describe, expect, it} from 'vitest'
import type {CatchUpLimits} from '../../../src/runtime/connectors/catch-up.js'
import {makeHome, fakeLlmConfig, type TestHome} from '../../helpers/home.js'
import type {FakeLlm} from '../../fakes/llm-server.js'
import {startFakeSlack, type FakeSlack} from '../../fakes/slack-server.js'
import {fakeLlmForTests} from '../../helpers/fake-llm-for-tests.js'
import {closeAfterEachTest, startTestGateway, stubRun, type TestGateway} from '../gateway/helpers.js'

const BOT = 'xoxb-test-bot-token'
const APP = 'xapp-1-test-app-token'
let llm: FakeLlm
let slack: FakeSlack
let test: TestGateway | undefined

fakeLlmForTests((started) => (llm = started))
const closeAfterTest = closeAfterEachTest()

type GatewayOptions = Parameters<typeof startTestGateway>[0]

async function gatewayWith(
  options: {
    botToken?: string
    run?: GatewayOptions['run']
    home?: TestHome
    catchUp?: CatchUpLimits
    connector?: Record<string, unknown>
  } = {},
) {
  slack ??= closeAfterTest(await startFakeSlack({botToken: BOT, appToken: APP}))
  test = await startTestGateway({
    agents: [
      {
        id: 'slacker',
        connectors: [
          {
            type: 'slack',
            bot_token: options.botToken ?? BOT,
            app_token: APP,
            api_url: slack.apiUrl,
            ...options.connector,
          },
        ],
      },
    ],
    llmBaseUrl: llm.openaiBaseUrl,
    run: options.run,
    home: options.home,
    catchUp: options.catchUp,
  })
  return options.home ? test : closeAfterTest(test)
}

beforeEach(() => {
  slack = undefined as unknown as FakeSlack
})

describe('Slack connector (real @slack/socket-mode + @slack/web-api against a fake Slack, real agent with the fake LLM)', () => {
  it('checks auth, answers a message in its thread, and acknowledges the event', async () => {
    llm.setDefault({text: 'Hello from the agent'})
    const gateway = await gatewayWith()
    await gateway.waitForLog(/slacker\/slack: connected \(as meepabot in Test Team\)/)
    expect(slack.calls.slice(0, 2)).toEqual(['auth.test', 'apps.connections.open'])
    const ts = slack.userSays({channel: 'C100', text: 'hi there'})
    const [reply] = await slack.waitForPosts(1)
    expect(reply).toMatchObject({channel: 'C100', thread_ts: ts})
    expect(reply?.text).toContain('Hello from the agent')
    expect(slack.acks.length).toBeGreaterThanOrEqual(1)
  })

  it('answers an @mention once although Slack sends it as message and app_mention, and keeps thread replies in the thread', async () => {
    const seen: string[] = []
    await gatewayWith({run: stubRun({onStart: (content) => seen.push(content)})})
    await slack.waitForHelloCount(1)
    const ts = slack.userSays({channel: 'C100', text: '<@UBOT> help'})
    slack.userSays({channel: 'C100', text: '<@UBOT> help', mention: true, ts})
    slack.userSays({channel: 'C100', text: 'in thread', thread_ts: '1600000000.000001'})
    const posts = await slack.waitForPosts(2)
    await new Promise((resolve) => setTimeout(resolve, 200))
    expect(seen).toEqual(['<@UBOT> help', 'in thread'])
    expect(posts.map((post) => post.thread_ts)).toEqual([ts, '1600000000.000001'])
    expect(slack.posts).toHaveLength(2) // the echoed bot replies (bot_id set) did not start runs
  })

  it('sends a reply longer than 4000 characters as ordered chunks in the thread', async () => {
    const long = Array.from(
      {length: 300},
      (_, i) => `line ${String(i).padStart(3, '0')} ${'abc '.repeat(5).trim()}`,
    ).join('\n')
    llm.setDefault({text: long})
    await gatewayWith()
    await slack.waitForHelloCount(1)
    const ts = slack.userSays({channel: 'C100', text: 'long please'})
    await slack.waitForPosts(2)
    await new Promise((resolve) => setTimeout(resolve, 200))
    for (const post of slack.posts) {
      expect(post.text.length).toBeLessThanOrEqual(4000)
      expect(post.thread_ts).toBe(ts)
    }
    expect(slack.posts.map((post) => post.text).join('\n')).toBe(long)
  })

  it('reconnects after the connection drops and keeps working', async () => {
    const gateway = await gatewayWith({run: stubRun()})
    await slack.waitForHelloCount(1)
    slack.dropConnections()
    await slack.waitForHelloCount(2)
    await gateway.waitForLog(/slacker\/slack: reconnecting \(connection closed; next attempt in 50 ms\)/)
    slack.userSays({channel: 'C200', text: 'after the drop'})
    expect((await slack.waitForPosts(1))[0]?.text).toBe('echo: after the drop')
  })

  it('reports a bad token, retries with backoff, and keeps the gateway serving', async () => {
    const gateway = await gatewayWith({botToken: 'xoxb-wrong', run: stubRun()})
    await gateway.waitForLog(
      /slacker\/slack: refused \(Slack refused the token \(invalid_auth\); check bot_token and app_token; next attempt in 50 ms\)/,
    )
    await slack.waitForCall('auth.test', 3)
    expect(slack.helloCount).toBe(0)
    expect((await gateway.chat({agent: 'slacker', message: 'ping'})).body.reply).toBe('echo: ping')
  })

  it('after an outage, answers once each what Slack delivers again, within the catch-up bounds, and says what it skipped', async () => {
    const seen: string[] = []
    const gateway = await gatewayWith({
      run: stubRun({onStart: (content) => seen.push(content)}),
      catchUp: {maxAgeMs: 60_000, maxMessages: 2, liveMarginMs: 0},
    })
    await slack.waitForHelloCount(1)
    slack.refuseConnections(true) // Slack unreachable: reconnect attempts fail
    slack.dropConnections()
    await gateway.waitForLog(/slacker\/slack: reconnecting \(/)
    const old = `${Math.floor(Date.now() / 1000) - 120}.000001`
    slack.userSays({channel: 'C100', text: 'two minutes old', ts: old})
    slack.userSays({channel: 'C100', text: 'first while down'})
    slack.userSays({channel: 'C200', text: 'second while down'})
    slack.userSays({channel: 'C100', text: 'third while down'})
    await new Promise((resolve) => setTimeout(resolve, 500))
    const health = await gateway.health()
    expect(health.body.connectors).toEqual({reconnecting: 1})
    expect(health.body.reasons?.[0]).toMatch(/^connector slacker\/slack reconnecting: .*; next attempt at \d{4}-/)

    slack.refuseConnections(false)
    await slack.waitForPosts(2)
    await gateway.waitForLog(
      /slacker\/slack: skipped 2 message\(s\) sent while it was disconnected: 1 older than 60 s, 1 beyond the 2 answered after one outage/,
    )
    expect(seen).toEqual(['first while down', 'second while down'])
    slack.userSays({channel: 'C100', text: 'live again'})
    await slack.waitForPosts(3)
    await new Promise((resolve) => setTimeout(resolve, 300))
    expect(seen).toEqual(['first while down', 'second while down', 'live again'])
    expect(slack.unacked).toBe(0) // skipped ones are acknowledged too: Slack stops sending them
    expect((await gateway.health()).body).toMatchObject({status: 'ok', connectors: {connected: 1}})
  })

  it('across a restart: what was answered is not answered again when Slack redelivers it, what came meanwhile is', async () => {
    slack = closeAfterTest(await startFakeSlack({botToken: BOT, appToken: APP}))
    const home = makeHome(
      fakeLlmConfig('http://127.0.0.1:9/v1', [
        {id: 'slacker', connectors: [{type: 'slack', bot_token: BOT, app_token: APP, api_url: slack.apiUrl}]},
      ]),
    )
    try {
      const seen: string[] = []
      const run = stubRun({onStart: (content) => seen.push(content)})
      const first = await gatewayWith({run, home})
      await slack.waitForHelloCount(1)
      slack.loseAcks(true) // the acknowledgement never reaches Slack (a crash right after answering)
      slack.userSays({channel: 'C100', text: 'answered before the restart'})
      await slack.waitForPosts(1)
      await first.close()
      slack.loseAcks(false)
      slack.userSays({channel: 'C100', text: 'sent while no gateway ran'})

      const second = await gatewayWith({run, home})
      try {
        await slack.waitForPosts(2)
        await new Promise((resolve) => setTimeout(resolve, 500))
        expect(seen).toEqual(['answered before the restart', 'sent while no gateway ran'])
        expect(slack.posts.map((post) => post.text)).toEqual([
          'echo: answered before the restart',
          'echo: sent while no gateway ran',
        ])
        expect(slack.unacked).toBe(0)
      } finally {
        await second.close()
      }
    } finally {
      home.cleanup()
    }
  })

  it('with channels and mention_only: answers only @mentions in the listed channels, and every DM', async () => {
    const seen: string[] = []
    await gatewayWith({
      run: stubRun({onStart: (content) => seen.push(content)}),
      connector: {channels: ['C100'], mention_only: true},
    })
    await slack.waitForHelloCount(1)
    slack.userSays({channel: 'C100', text: 'not for the bot'})
    slack.userSays({channel: 'C200', text: '<@UBOT> unlisted channel', mention: true})
    const ts = slack.userSays({channel: 'C100', text: '<@UBOT> listed and mentioned'})
    slack.userSays({channel: 'C100', text: '<@UBOT> listed and mentioned', mention: true, ts})
    slack.userSays({channel: 'D300', text: 'a DM, no mention', channel_type: 'im'})
    await slack.waitForPosts(2)
    await new Promise((resolve) => setTimeout(resolve, 300))
    expect(seen).toEqual(['<@UBOT> listed and mentioned', 'a DM, no mention'])
    expect(slack.unacked).toBe(0) // what it ignores is acknowledged too
  })
})
