import Database from 'better-sqlite3'
import path from 'node:path'
import {describe, expect, it} from 'vitest'
import {startFakeDiscord} from '../../fakes/discord-server.js'
import type {PostFaults} from '../../fakes/fake-http.js'
import {startFakeMeepaChat} from '../../fakes/meepachat-server.js'
import {startFakeSlack} from '../../fakes/slack-server.js'
import {waitFor as waitForValue} from '../../helpers/wait-for.js'
import {closeAfterEachTest, startTestGateway, stubRun, type TestGateway} from './helpers.js'

/** What a test needs of a platform's wire fake, whichever platform it is. */
interface PlatformFake {
  faults: PostFaults
  goOffline(): Promise<void>
  comeBack(): Promise<void>
  close(): Promise<void>
  userSays(channel: string, text: string): void
  /** What the bot posted, in order. */
  posts(): Array<{channel: string; text: string}>
}

interface Platform {
  name: string
  type: string
  limit: number
  channels: [string, string]
  start(): Promise<{fake: PlatformFake; connector: Record<string, unknown>}>
}

const PLATFORMS: Platform[] = [
  {
    name: 'MeepaChat',
    type: 'meepachat',
    limit: 4000,
    channels: ['general', 'random'],
    start: async () => {
      const chat = await startFakeMeepaChat({token: '1.secret'})
      return platformFake(
        chat,
        {type: 'meepachat', url: chat.gatewayUrl, bot_token: '1.secret'},
        {
          userSays: (channelId, content) => void chat.userSays({channelId, content}),
          posts: () => chat.posts.map((post) => ({channel: post.channelId, text: post.content})),
        },
      )
    },
  },
  {
    name: 'Discord',
    type: 'discord',
    limit: 2000,
    channels: ['1001', '1002'],
    start: async () => {
      const discord = await startFakeDiscord({token: 'MTIz.discord.token'})
      const connector = {type: 'discord', bot_token: 'MTIz.discord.token', guild_ids: [], api_url: discord.apiUrl}
      return platformFake(discord, connector, {
        userSays: (channelId, content) => void discord.userSays({channelId, content}),
        posts: () => discord.posts.map((post) => ({channel: post.channelId, text: post.content})),
      })
    },
  },
  {
    name: 'Slack',
    type: 'slack',
    limit: 4000,
    channels: ['C1', 'C2'],
    start: async () => {
      const slack = await startFakeSlack({botToken: 'xoxb-1', appToken: 'xapp-1'})
      const connector = {type: 'slack', bot_token: 'xoxb-1', app_token: 'xapp-1', api_url: slack.apiUrl}
      return platformFake(slack, connector, {
        userSays: (channel, text) => void slack.userSays({channel, text}),
        posts: () => slack.posts.map(({channel, text}) => ({channel, text})),
      })
    },
  },
]

function platformFake(
  fake: Omit<PlatformFake, 'userSays' | 'posts'>,
  connector: Record<string, unknown>,
  conversation: Pick<PlatformFake, 'userSays' | 'posts'>,
): {fake: PlatformFake; connector: Record<string, unknown>} {
  return {
    connector,
    fake: {
      faults: fake.faults,
      goOffline: () => fake.goOffline(),
      comeBack: () => fake.comeBack(),
      close: () => fake.close(),
      ...conversation,
    },
  }
}

const closeAfterTest = closeAfterEachTest()
const waitFor = (check: () => boolean, what: string, ms = 10_000) => waitForValue(what, check, ms)
const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms))

describe.each(PLATFORMS)('$name replies through the outbox (faults injected in the wire fake)', (platform) => {
  const [channel, otherChannel] = platform.channels

  async function start(
    options: {run?: Parameters<typeof startTestGateway>[0]['run']; deliveryMinutes?: number} = {},
  ): Promise<{fake: PlatformFake; test: TestGateway}> {
    const {fake, connector} = await platform.start()
    closeAfterTest(fake)
    const test = closeAfterTest(
      await startTestGateway({
        agents: [{id: 'bot', connectors: [connector]}],
        run: options.run ?? stubRun(),
        ...(options.deliveryMinutes ? {gateway: {reply_delivery_minutes: options.deliveryMinutes}} : {}),
      }),
    )
    await test.waitForLog(new RegExp(`bot/${platform.type}: connected`))
    return {fake, test}
  }

  const record = (test: TestGateway) =>
    test.gateway.db.prepare('SELECT * FROM runs ORDER BY started_at DESC').get() as any
  const repliesIn = (fake: PlatformFake, where: string) =>
    fake
      .posts()
      .filter((post) => post.channel === where)
      .map((post) => post.text)

  async function healthz(test: TestGateway): Promise<any> {
    return (await fetch(`${test.gateway.url}/healthz`)).json()
  }

  it('delivers a reply once the platform is reachable again after an outage longer than any old retry', async () => {
    const {fake, test} = await start({run: stubRun({delayMs: 300})})
    fake.userSays(channel, 'during the outage')
    await test.waitForLog(/run \S+: agent bot via \S+ ok/, 5000).catch(() => {})
    await fake.goOffline() // the run is still going: its reply finds the platform gone
    await test.waitForLog(/reply via bot\/\S+ .*not delivered yet/, 10_000)
    expect(record(test)).toMatchObject({status: 'ok', delivery: 'pending'})
    await sleep(2500)
    await fake.comeBack()
    await waitFor(() => repliesIn(fake, channel).length === 1, 'the reply after the outage', 20_000)
    expect(repliesIn(fake, channel)).toEqual(['echo: during the outage'])
    await waitFor(() => record(test)?.delivery === 'delivered', 'the record to say delivered')
    expect((await healthz(test)).replies).toEqual({pending: 0, undeliverable_24h: 0})
  })

  it('retries through three 503s in a row and delivers the reply once', async () => {
    const {fake, test} = await start()
    fake.faults.failPosts({status: 503, times: 3})
    fake.userSays(channel, 'hello')
    await waitFor(() => repliesIn(fake, channel).length === 1, 'the reply after three 503s', 15_000)
    await sleep(300)
    expect(repliesIn(fake, channel)).toEqual(['echo: hello'])
    expect(fake.faults.attempts.map((attempt) => attempt.status)).toEqual([503, 503, 503, 200])
    await waitFor(() => record(test)?.delivery === 'delivered', 'the record to say delivered')
    await test.waitForLog(/reply delivered via bot\/\S+ .* after 3 failed attempt\(s\)/)
  })

  it("waits out a 429's Retry-After before it tries again", async () => {
    const {fake} = await start()
    fake.faults.failPosts({status: 429, retryAfterSeconds: 2, times: 1})
    fake.userSays(channel, 'slow down')
    await waitFor(() => repliesIn(fake, channel).length === 1, 'the reply after the 429', 15_000)
    const [limited, taken] = fake.faults.attempts
    expect(limited?.status).toBe(429)
    expect(taken!.time - limited!.time).toBeGreaterThanOrEqual(1900)
  })

  it('gives up after the delivery window: the record says undeliverable and why, the log warns, /healthz counts it', async () => {
    const {fake, test} = await start({deliveryMinutes: 0.05}) // 3 s
    fake.faults.failPosts({status: 429, retryAfterSeconds: 1})
    fake.userSays(channel, 'never arrives')
    const warning = await test.waitForLog(/^WARNING run \S+: the reply via bot\/\S+ could not be delivered/, 15_000)
    expect(warning).toMatch(/rate-limited|429|ratelimited/)
    expect(record(test)).toMatchObject({status: 'ok', delivery: 'undeliverable'})
    expect(record(test).delivery_error).toMatch(/still failing/)
    const health = await healthz(test)
    expect(health.status).toBe('degraded')
    expect(health.replies).toEqual({pending: 0, undeliverable_24h: 1})
    expect(health.reasons).toContainEqual(expect.stringMatching(/replies undeliverable: 1 in the last hour/))
    // the platform is back: the agent answers the next message as usual
    fake.faults.failPosts(undefined)
    fake.userSays(channel, 'and now?')
    await waitFor(() => repliesIn(fake, channel).includes('echo: and now?'), 'the next reply', 15_000)
    expect(repliesIn(fake, channel)).not.toContain('echo: never arrives')
  })

  it('delivers every chunk of a long reply in order when one fails and the platform rate-limits the rest', async () => {
    const rows = Array.from({length: 12}, (_, i) => `row ${i} ${'x'.repeat(60)}`).join('\n')
    const long = Array.from({length: 6}, (_, i) => `Part ${i}\n\n\`\`\`ts\n${rows}\n\`\`\``)
      .join('\n\n')
      .repeat(Math.ceil((3 * platform.limit) / 5000))
    const {fake, test} = await start({run: stubRun({reply: () => long})})
    fake.faults.failPosts({status: 503, times: 1, afterTaken: 1})
    fake.userSays(channel, 'long one')
    await waitFor(() => fake.faults.attempts.length >= 2, 'the failed second chunk', 10_000)
    fake.faults.limitPosts({max: 1, perMs: 1500, retryAfterSeconds: 1})
    await waitFor(() => record(test)?.delivery === 'delivered', 'the whole reply', 40_000)
    const chunks = repliesIn(fake, channel)
    expect(chunks.length).toBeGreaterThanOrEqual(4)
    expect(fake.faults.attempts.some((attempt) => attempt.status === 429)).toBe(true)
    for (const chunk of chunks) {
      expect(chunk.length).toBeLessThanOrEqual(platform.limit)
      expect(chunk.split('\n').filter((line) => line.startsWith('```')).length % 2, chunk).toBe(0)
    }
    const words = (text: string) => text.split(/\s+/).filter((word) => word && !word.startsWith('```'))
    expect(words(chunks.join('\n'))).toEqual(words(long))
  })

  it('tells the user when the platform refuses part of a reply, and records it as undeliverable', async () => {
    const long = Array.from({length: 3}, (_, i) => `${i} ${'y'.repeat(platform.limit - 10)}`).join('\n\n')
    const {fake, test} = await start({run: stubRun({reply: () => long})})
    fake.faults.failPosts({status: 400, times: 1, afterTaken: 1})
    fake.userSays(channel, 'too much')
    await waitFor(() => record(test)?.delivery === 'undeliverable', 'the record to say undeliverable', 10_000)
    await waitFor(() => repliesIn(fake, channel).length === 2, 'the first chunk and the notice')
    const [first, notice] = repliesIn(fake, channel)
    expect(first?.startsWith('0 y')).toBe(true)
    expect(notice).toMatch(/the rest of my answer could not be sent.*ref /)
    await test.waitForLog(/^WARNING run \S+: the reply via .* \(1 part\(s\) had gone out\)/)
  })

  it("does not hold the agent or another conversation while one conversation's reply waits", async () => {
    const started: number[] = []
    const {fake, test} = await start({run: stubRun({onStart: () => started.push(Date.now())})})
    fake.faults.failPosts({status: 429, retryAfterSeconds: 4, channelId: channel})
    fake.userSays(channel, 'first')
    await waitFor(() => fake.faults.attempts.length === 1, 'the rate-limited reply')
    const asked = Date.now()
    fake.userSays(otherChannel, 'second')
    await waitFor(() => repliesIn(fake, otherChannel).length === 1, 'the other conversation’s reply', 3000)
    expect(Date.now() - asked).toBeLessThan(2000)
    expect(repliesIn(fake, channel)).toEqual([])
    expect(started).toHaveLength(2)
    fake.faults.failPosts(undefined)
    await waitFor(() => repliesIn(fake, channel).length === 1, 'the first reply after its Retry-After', 10_000)
    expect(repliesIn(fake, channel)).toEqual(['echo: first'])
    expect(test.gateway.queue.running + test.gateway.queue.waiting).toBe(0)
  })
})

describe('MeepaChat: a Retry-After longer than 10 s', () => {
  it('is waited out in full, not capped and abandoned', async () => {
    const chat = closeAfterTest(await startFakeMeepaChat({token: '1.secret'}))
    const test = closeAfterTest(
      await startTestGateway({
        agents: [{id: 'bot', connectors: [{type: 'meepachat', url: chat.gatewayUrl, bot_token: '1.secret'}]}],
        run: stubRun(),
      }),
    )
    await test.waitForLog(/bot\/meepachat: connected/)
    chat.faults.failPosts({status: 429, retryAfterSeconds: 11, times: 1})
    chat.userSays({channelId: 'general', content: 'patience'})
    const [reply] = await chat.waitForPosts(1, 20_000)
    expect(reply?.content).toBe('echo: patience')
    const [limited, taken] = chat.faults.attempts
    expect(taken!.time - limited!.time).toBeGreaterThanOrEqual(10_900)
  }, 30_000)

  it('does not hold a stopping gateway: a reply waiting for its retry stays in the outbox for the next start', async () => {
    const chat = closeAfterTest(await startFakeMeepaChat({token: '1.secret'}))
    const test = await startTestGateway({
      agents: [{id: 'bot', connectors: [{type: 'meepachat', url: chat.gatewayUrl, bot_token: '1.secret'}]}],
      run: stubRun(),
    })
    try {
      await test.waitForLog(/bot\/meepachat: connected/)
      chat.faults.failPosts({status: 429, retryAfterSeconds: 60})
      chat.userSays({channelId: 'general', content: 'later'})
      await test.waitForLog(/not delivered yet/)
      const stopping = Date.now()
      await test.gateway.stop({graceMs: 5000})
      expect(Date.now() - stopping).toBeLessThan(3000)
      const db = new Database(path.join(test.home.home, 'gateway.db'), {readonly: true})
      const left = db.prepare('SELECT attempts FROM outbox').all()
      db.close()
      expect(left).toEqual([{attempts: 1}])
    } finally {
      test.home.cleanup()
    }
  })
})
