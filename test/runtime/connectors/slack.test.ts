import {describe, expect, it} from 'vitest'
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

async function gatewayWith(options: {botToken?: string; run?: Parameters<typeof startTestGateway>[0]['run']} = {}) {
  slack = closeAfterTest(await startFakeSlack({botToken: BOT, appToken: APP}))
  test = closeAfterTest(
    await startTestGateway({
      agents: [
        {
          id: 'slacker',
          connectors: [{type: 'slack', bot_token: options.botToken ?? BOT, app_token: APP, api_url: slack.apiUrl}],
        },
      ],
      llmBaseUrl: llm.openaiBaseUrl,
      run: options.run,
    }),
  )
  return test
}

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
    await gateway.waitForLog(/slacker\/slack: disconnected \(connection closed; reconnecting in 50 ms\)/)
    slack.userSays({channel: 'C200', text: 'after the drop'})
    expect((await slack.waitForPosts(1))[0]?.text).toBe('echo: after the drop')
  })

  it('reports a bad token, retries with backoff, and keeps the gateway serving', async () => {
    const gateway = await gatewayWith({botToken: 'xoxb-wrong', run: stubRun()})
    await gateway.waitForLog(
      /slacker\/slack: disconnected \(Slack refused the token \(invalid_auth\); check bot_token and app_token; reconnecting in 50 ms\)/,
    )
    await slack.waitForCall('auth.test', 3)
    expect(slack.helloCount).toBe(0)
    expect((await gateway.chat({agent: 'slacker', message: 'ping'})).body.reply).toBe('echo: ping')
  })
})
