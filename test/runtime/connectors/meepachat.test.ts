import {describe, expect, it} from 'vitest'
import type {FakeLlm} from '../../fakes/llm-server.js'
import {startFakeMeepaChat, type FakeMeepaChat} from '../../fakes/meepachat-server.js'
import {RunRecords} from '../../../src/runtime/state/run-records.js'
import {fakeLlmForTests} from '../../helpers/fake-llm-for-tests.js'
import {waitFor} from '../../helpers/wait-for.js'
import {closeAfterEachTest, startTestGateway, stubRun, type TestGateway} from '../gateway/helpers.js'

const TOKEN = '11.meepa-secret'
let llm: FakeLlm
let chat: FakeMeepaChat
let test: TestGateway | undefined

fakeLlmForTests((started) => (llm = started))
const closeAfterTest = closeAfterEachTest()

const lastUserMessage = (request: {body: any}) => {
  const messages = request.body.messages as Array<{role: string; content: unknown}>
  const last = [...messages].reverse().find((message) => message.role === 'user')
  return typeof last?.content === 'string' ? last.content : JSON.stringify(last?.content)
}

async function gatewayWith(
  options: {
    token?: string
    run?: Parameters<typeof startTestGateway>[0]['run']
    gateway?: Record<string, unknown>
    /** More connector fields (channels, mention_only, ...). */
    connector?: Record<string, unknown>
  } = {},
) {
  chat = closeAfterTest(await startFakeMeepaChat({token: TOKEN}))
  test = closeAfterTest(
    await startTestGateway({
      agents: [
        {
          id: 'meepa',
          connectors: [
            {type: 'meepachat', url: chat.gatewayUrl, bot_token: options.token ?? TOKEN, ...options.connector},
          ],
        },
      ],
      llmBaseUrl: llm.openaiBaseUrl,
      run: options.run,
      gateway: options.gateway,
    }),
  )
  return test
}

describe('MeepaChat connector (fake MeepaChat server, real agent with the fake LLM)', () => {
  it('answers a message in the same channel, with typing, and records the run', async () => {
    llm.setDefault((request) => ({text: `You said: ${lastUserMessage(request)}`}))
    const gateway = await gatewayWith()
    await chat.waitForReadyCount(1)
    await gateway.waitForLog(/meepa\/meepachat: connected \(as meepabot/)
    chat.userSays({channelId: 'general', content: 'hello bot'})
    const [reply] = await chat.waitForPosts(1)
    expect(reply).toMatchObject({
      channelId: 'general',
      serverId: 'server-1',
      path: '/api/servers/server-1/channels/general/messages',
    })
    expect(reply?.content).toContain('You said: hello bot')
    expect(chat.frames.some((frame) => frame.type === 'typing' && frame.data?.channelId === 'general')).toBe(true)
    const [record] = new RunRecords(gateway.gateway.db).list()
    expect(record).toMatchObject({
      agent_id: 'meepa',
      connector: 'meepachat',
      channel_id: 'general',
      status: 'ok',
      isolation: 'unrestricted',
    })
    expect(record?.input_tokens).toBeGreaterThan(0)
  })

  it('replies in the thread and to DM channels through the DM endpoint', async () => {
    llm.setDefault({text: 'ok'})
    await gatewayWith()
    await chat.waitForReadyCount(1)
    chat.userSays({channelId: 'general', content: 'in a thread', threadId: 'parent-1'})
    await chat.waitForPosts(1)
    chat.userSays({channelId: 'dm-alice', content: 'a DM'})
    const posts = await chat.waitForPosts(2)
    expect(posts[0]).toMatchObject({threadId: 'parent-1', channelId: 'general'})
    expect(posts[1]).toMatchObject({path: '/api/dms/dm-alice/messages', serverId: null})
  })

  it('sends a reply longer than 4000 characters as ordered chunks', async () => {
    const long = Array.from(
      {length: 400},
      (_, i) => `paragraph ${String(i).padStart(3, '0')} ${'lorem ipsum '.repeat(2).trim()}`,
    ).join('\n')
    llm.setDefault({text: long})
    await gatewayWith()
    await chat.waitForReadyCount(1)
    chat.userSays({channelId: 'general', content: 'write a lot'})
    const expected = Math.ceil(long.length / 4000)
    const posts = await chat.waitForPosts(expected)
    await new Promise((resolve) => setTimeout(resolve, 200))
    expect(chat.posts.length).toBeGreaterThanOrEqual(2)
    for (const post of chat.posts) expect(post.content.length).toBeLessThanOrEqual(4000)
    expect(chat.posts.map((post) => post.content).join('\n')).toBe(long)
    expect(posts[0]?.content.startsWith('paragraph 000')).toBe(true)
  })

  it('ignores its own messages, other bots and duplicate ids', async () => {
    const seen: string[] = []
    await gatewayWith({run: stubRun({onStart: (content) => seen.push(content)})})
    await chat.waitForReadyCount(1)
    chat.userSays({
      channelId: 'general',
      content: 'from another bot',
      user: {id: 'bot-2', username: 'otherbot', bot: true},
    })
    chat.userSays({
      channelId: 'general',
      content: 'pretending to be me',
      user: {id: chat.botUser.id, username: 'meepabot'},
    })
    chat.userSays({channelId: 'general', content: 'once', id: 'dup-1'})
    chat.userSays({channelId: 'general', content: 'once', id: 'dup-1'})
    await chat.waitForPosts(1)
    await new Promise((resolve) => setTimeout(resolve, 300)) // the echoed reply must not start another run
    expect(seen).toEqual(['once'])
    expect(chat.posts).toHaveLength(1)
  })

  it('survives malformed and unexpected frames', async () => {
    await gatewayWith({run: stubRun()})
    await chat.waitForReadyCount(1)
    chat.sendRaw('not json at all')
    chat.sendRaw({type: 'message.created', data: null})
    chat.sendRaw({type: 'message.created', data: {id: 'weird', channelId: 'general', userId: 'user-1', content: 42}})
    chat.sendRaw({
      type: 'message.created',
      data: {id: 'weird2', channelId: 'general', userId: 'user-1', content: 'x', user: 'not an object'},
    })
    chat.sendRaw({type: 'server.added', data: {id: 's9', channels: 'nope'}})
    chat.sendRaw({type: 'something.new', data: {}})
    chat.userSays({channelId: 'general', content: 'still fine?'})
    await chat.waitForPosts(2)
    expect(chat.posts.map((post) => post.content)).toEqual(['echo: x', 'echo: still fine?'])
    expect(test!.gateway.connectors[0]?.state).toBe('connected')
  })

  it('reconnects after the server drops the connection and keeps working', async () => {
    await gatewayWith({run: stubRun()})
    await chat.waitForReadyCount(1)
    chat.dropConnections()
    await chat.waitForReadyCount(2)
    await test!.waitForLog(/meepa\/meepachat: reconnecting \(connection closed \(code 1006\); next attempt in/)
    chat.userSays({channelId: 'general', content: 'after the drop'})
    const [reply] = await chat.waitForPosts(1)
    expect(reply?.content).toBe('echo: after the drop')
  })

  it('pings every interval and reconnects when the connection goes silent', async () => {
    await gatewayWith({run: stubRun()})
    await chat.waitForReadyCount(1)
    chat.stopAnswering() // the socket stays open but nothing comes back, like a dead NAT mapping
    await chat.waitForReadyCount(2, 5000)
    expect(chat.frames.filter((frame) => frame.type === 'ping').length).toBeGreaterThanOrEqual(1)
    chat.userSays({channelId: 'general', content: 'still there?'})
    expect((await chat.waitForPosts(1))[0]?.content).toBe('echo: still there?')
  })

  it('reports a bad token, retries with backoff, and keeps the gateway serving', async () => {
    const gateway = await gatewayWith({token: '11.wrong', run: stubRun()})
    await gateway.waitForLog(
      /meepa\/meepachat: refused \(the server refused the bot token \(HTTP 401\); check bot_token; next attempt in 50 ms\)/,
    )
    await waitFor('three refused attempts', () => chat.refused >= 3)
    // retried, but said once (not a line per attempt)
    expect(gateway.logs.filter((line) => / refused \(/.test(line))).toHaveLength(1)
    const {status, body} = await gateway.chat({agent: 'meepa', message: 'still alive?'})
    expect(status).toBe(200)
    expect(body.reply).toBe('echo: still alive?')
  })

  it('answers a failed run (provider down) with a short reply and keeps the full error in the record', async () => {
    process.env.MEEPA_RETRY_BASE_MS = '10'
    llm.setDefault({status: 500, message: 'upstream exploded'})
    const gateway = await gatewayWith()
    await chat.waitForReadyCount(1)
    chat.userSays({channelId: 'general', content: 'are you there?'})
    const [reply] = await chat.waitForPosts(1, 30_000)
    expect(reply?.content).toMatch(
      /^Sorry, I can't reach my language model right now\. Please try again in a few minutes\. \(ref run_\w+\)$/,
    )
    const [record] = new RunRecords(gateway.gateway.db).list()
    expect(record).toMatchObject({status: 'failed', error_code: 'E_PROVIDER'})
    expect(record?.error_message).toMatch(/500/)
    await gateway.waitForLog(/run run_\w+: agent meepa via meepachat failed in \d+ ms \(unrestricted\): E_PROVIDER/)
  })

  it('answers a run that hits the agent timeout with a timeout reply', async () => {
    llm.setDefault({text: 'too slow', delayMs: 5000})
    chat = closeAfterTest(await startFakeMeepaChat({token: TOKEN}))
    test = closeAfterTest(
      await startTestGateway({
        agents: [
          {id: 'meepa', timeout_seconds: 1, connectors: [{type: 'meepachat', url: chat.gatewayUrl, bot_token: TOKEN}]},
        ],
        llmBaseUrl: llm.openaiBaseUrl,
      }),
    )
    await chat.waitForReadyCount(1)
    chat.userSays({channelId: 'general', content: 'slow question'})
    const [reply] = await chat.waitForPosts(1, 15_000)
    expect(reply?.content).toMatch(/^Sorry, that took too long and was stopped/)
    expect(new RunRecords(test.gateway.db).list()[0]).toMatchObject({status: 'failed', error_code: 'E_TIMEOUT'})
  })

  it('while stopping, finishes the running message and tells new senders the gateway is restarting', async () => {
    let firstStarted!: () => void
    const started = new Promise<void>((resolve) => (firstStarted = resolve))
    const gateway = await gatewayWith({run: stubRun({delayMs: 600, onStart: () => firstStarted()})})
    await chat.waitForReadyCount(1)
    chat.userSays({channelId: 'general', content: 'first'})
    await started
    const stopping = gateway.gateway.stop({graceMs: 5000})
    chat.userSays({channelId: 'random', content: 'second'})
    await stopping
    const contents = chat.posts.map((post) => `${post.channelId}: ${post.content}`)
    expect(contents).toContain('general: echo: first')
    expect(contents).toContain(
      'random: The gateway is restarting, so I could not take this message. Please send it again in a minute.',
    )
  })

  it('answers 30 messages to one agent in order', async () => {
    const started: string[] = []
    await gatewayWith({run: stubRun({delayMs: 2, onStart: (content) => started.push(content)})})
    await chat.waitForReadyCount(1)
    const sent = Array.from({length: 30}, (_, i) => `message ${i}`)
    for (const content of sent) chat.userSays({channelId: 'general', content})
    const posts = await chat.waitForPosts(30)
    expect(started).toEqual(sent)
    expect(posts.map((post) => post.content)).toEqual(sent.map((content) => `echo: ${content}`))
  })

  it('tells senders past the queue bound to try again, and answers every accepted message', async () => {
    await gatewayWith({run: stubRun({delayMs: 100}), gateway: {queue_limit: 3, max_concurrent_runs: 2}})
    await chat.waitForReadyCount(1)
    for (let i = 0; i < 10; i++) chat.userSays({channelId: 'general', content: `burst ${i}`})
    const posts = await chat.waitForPosts(10)
    const answered = posts.filter((post) => post.content.startsWith('echo:')).map((post) => post.content)
    const busy = posts.filter((post) => post.content.includes('busy'))
    expect(answered).toEqual(['echo: burst 0', 'echo: burst 1', 'echo: burst 2', 'echo: burst 3'])
    expect(busy).toHaveLength(6)
    const statuses = new RunRecords(test!.gateway.db).list({limit: 100}).map((run) => run.status)
    expect(statuses.filter((status) => status === 'rejected')).toHaveLength(6)
    expect(statuses.filter((status) => status === 'ok')).toHaveLength(4)
  })

  it('after an outage: reconnecting with the next attempt in /healthz, a line per cause not per attempt, and the operator told what went unseen', async () => {
    const seen: string[] = []
    const gateway = await gatewayWith({run: stubRun({onStart: (content) => seen.push(content)})})
    await chat.waitForReadyCount(1)
    chat.refuseConnections(true)
    chat.dropConnections()
    await gateway.waitForLog(
      /meepa\/meepachat: reconnecting \(the server answered HTTP 503 instead of a WebSocket; next attempt in/,
    )
    chat.userSays({channelId: 'general', content: 'while the bot was away'}) // the server delivers it to no bot
    await new Promise((resolve) => setTimeout(resolve, 1000)) // several failed attempts
    const health = await gateway.health()
    expect(health.body.connectors).toEqual({reconnecting: 1})
    expect(health.body.reasons?.[0]).toMatch(
      /^connector meepa\/meepachat reconnecting: the server answered HTTP 503 instead of a WebSocket; next attempt at \d{4}-/,
    )
    // the drop, then the 503s: two causes, two lines
    expect(gateway.logs.filter((line) => line.includes('meepa/meepachat: reconnecting'))).toHaveLength(2)

    chat.refuseConnections(false)
    await gateway.waitForLog(/meepa\/meepachat: connected \(as meepabot, .* after [\d.]+ m?s down\)/)
    await gateway.waitForLog(
      /meepa\/meepachat: messages sent to it while it was disconnected \(since \d{4}-.*\) go unanswered: the MeepaChat bot gateway does not replay them/,
    )
    chat.userSays({channelId: 'general', content: 'back again'})
    expect((await chat.waitForPosts(1))[0]?.content).toBe('echo: back again')
    expect(seen).toEqual(['back again'])
    expect((await gateway.health()).body).toMatchObject({status: 'ok', connectors: {connected: 1}})
  })

  it('with channels and mention_only: answers only @mentions in the listed channels, and every DM', async () => {
    const seen: string[] = []
    await gatewayWith({
      run: stubRun({onStart: (content) => seen.push(content)}),
      connector: {channels: ['general'], mention_only: true},
    })
    await chat.waitForReadyCount(1)
    chat.userSays({channelId: 'general', content: 'not for the bot'})
    chat.userSays({channelId: 'random', content: '@meepabot in an unlisted channel'})
    chat.userSays({channelId: 'general', content: 'hey @meepabot, by name'})
    chat.userSays({channelId: 'general', content: 'by mention list', mentions: [{id: chat.botUser.id}]})
    chat.userSays({channelId: 'dm-alice', content: 'a DM, no mention'})
    await chat.waitForPosts(3)
    await new Promise((resolve) => setTimeout(resolve, 300))
    expect(seen).toEqual(['hey @meepabot, by name', 'by mention list', 'a DM, no mention'])
    // each conversation's replies go out in order; two conversations' replies may interleave
    expect(chat.posts.map((post) => post.channelId).sort()).toEqual(['dm-alice', 'general', 'general'])
  })
})
