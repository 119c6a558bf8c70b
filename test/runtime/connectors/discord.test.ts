import crypto from 'node:crypto'
import http from 'node:http'
import net from 'node:net'
import {describe, expect, it} from 'vitest'
import type {FakeLlm} from '../../fakes/llm-server.js'
import {startFakeDiscord, type FakeDiscord} from '../../fakes/discord-server.js'
import {fakeLlmForTests} from '../../helpers/fake-llm-for-tests.js'
import {waitFor} from '../../helpers/wait-for.js'
import {closeAfterEachTest, startTestGateway, stubRun, type TestGateway} from '../gateway/helpers.js'

const TOKEN = 'MTIz.discord.token'
let llm: FakeLlm
let discord: FakeDiscord
let test: TestGateway | undefined

fakeLlmForTests((started) => (llm = started))
const closeAfterTest = closeAfterEachTest()

async function gatewayWith(
  options: {
    token?: string
    guildIds?: string[]
    run?: Parameters<typeof startTestGateway>[0]['run']
    connector?: Record<string, unknown>
  } = {},
) {
  discord = closeAfterTest(await startFakeDiscord({token: TOKEN}))
  test = closeAfterTest(
    await startTestGateway({
      agents: [
        {
          id: 'disco',
          connectors: [
            {
              type: 'discord',
              bot_token: options.token ?? TOKEN,
              guild_ids: options.guildIds ?? [],
              api_url: discord.apiUrl,
              ...options.connector,
            },
          ],
        },
      ],
      llmBaseUrl: llm.openaiBaseUrl,
      run: options.run,
    }),
  )
  return test
}

describe('Discord connector (real discord.js against a fake REST API and Gateway, real agent with the fake LLM)', () => {
  it('answers a message in the same channel with a typing indicator', async () => {
    llm.setDefault({text: 'Hi from the agent'})
    const gateway = await gatewayWith()
    await gateway.waitForLog(/disco\/discord: connected \(as meepabot, 2 guild\(s\)\)/)
    discord.userSays({channelId: '1001', content: 'hello discord'})
    const [reply] = await discord.waitForPosts(1)
    expect(reply).toMatchObject({channelId: '1001'})
    expect(reply?.content).toContain('Hi from the agent')
    expect(discord.typing).toContain('1001')
  })

  it('answers a direct message', async () => {
    await gatewayWith({run: stubRun()})
    await test!.waitForLog(/disco\/discord: connected/)
    discord.userSays({channelId: '3001', content: 'psst', guildId: null})
    expect(await discord.waitForPosts(1)).toMatchObject([{channelId: '3001', content: 'echo: psst'}])
  })

  it('sends a reply longer than 2000 characters as ordered chunks', async () => {
    const long = Array.from(
      {length: 200},
      (_, i) => `row ${String(i).padStart(3, '0')} ${'word '.repeat(4).trim()}`,
    ).join('\n')
    llm.setDefault({text: long})
    await gatewayWith()
    await test!.waitForLog(/disco\/discord: connected/)
    discord.userSays({channelId: '1001', content: 'long one'})
    await discord.waitForPosts(Math.ceil(long.length / 2000))
    await new Promise((resolve) => setTimeout(resolve, 200))
    for (const post of discord.posts) expect(post.content.length).toBeLessThanOrEqual(2000)
    expect(discord.posts.map((post) => post.content).join('\n')).toBe(long)
  })

  it('ignores its own messages and other bots, and guilds outside guild_ids', async () => {
    const seen: string[] = []
    await gatewayWith({guildIds: ['100'], run: stubRun({onStart: (content) => seen.push(content)})})
    await test!.waitForLog(/disco\/discord: connected/)
    discord.userSays({channelId: '1001', content: 'from a bot', author: {id: '777', username: 'otherbot', bot: true}})
    discord.userSays({channelId: '1001', content: 'as myself', author: {id: discord.botUser.id, username: 'meepabot'}})
    discord.userSays({channelId: '2001', content: 'other guild'})
    discord.userSays({channelId: '1002', content: 'allowed guild'})
    await discord.waitForPosts(1)
    await new Promise((resolve) => setTimeout(resolve, 300)) // the echoed reply must not start another run
    expect(seen).toEqual(['allowed guild'])
    expect(discord.posts).toHaveLength(1)
  })

  it('resumes after the gateway connection drops and keeps working', async () => {
    const gateway = await gatewayWith({run: stubRun()})
    await gateway.waitForLog(/disco\/discord: connected/)
    discord.dropConnections()
    await discord.waitFor(() => discord.resumes + discord.identifies >= 2, 'a resume or re-identify')
    await gateway.waitForLog(
      /disco\/discord: reconnecting \(connection lost, resuming the session; next attempt in 500 ms\)/,
    )
    await gateway.waitForLog(
      /disco\/discord: connected \(session resumed, \d+ event\(s\) replayed, after [\d.]+ m?s down\)/,
    )
    discord.userSays({channelId: '1001', content: 'after the drop'})
    expect((await discord.waitForPosts(1))[0]?.content).toBe('echo: after the drop')
  })

  it('reports a bad token, retries with backoff, and keeps the gateway serving', async () => {
    const gateway = await gatewayWith({token: 'bad.token', run: stubRun()})
    await gateway.waitForLog(
      /disco\/discord: refused \(Discord refused the bot token \(TokenInvalid\); check bot_token; next attempt in 50 ms\)/,
    )
    await waitFor('three refused attempts', () => discord.refused >= 3)
    // retried, but said once (not a line per attempt)
    expect(gateway.logs.filter((line) => / refused \(/.test(line))).toHaveLength(1)
    expect((await gateway.chat({agent: 'disco', message: 'ping'})).body.reply).toBe('echo: ping')
  })

  it('after an outage, resumes its session: what was sent meanwhile is answered once, and the state says so throughout', async () => {
    const gateway = await gatewayWith({run: stubRun()})
    await gateway.waitForLog(/disco\/discord: connected/)
    discord.refuseConnections(true) // Discord unreachable: every reconnect attempt fails
    discord.dropConnections()
    await gateway.waitForLog(
      /disco\/discord: reconnecting \(connection lost, resuming the session; next attempt in 500 ms\)/,
    )
    discord.userSays({channelId: '1001', content: 'sent while you were away'})
    discord.userSays({channelId: '3001', content: 'a DM meanwhile', guildId: null})
    await new Promise((resolve) => setTimeout(resolve, 1600)) // a few failed attempts
    const health = await gateway.health()
    expect(health.status).toBe(503)
    expect(health.body.connectors).toEqual({reconnecting: 1})
    expect(health.body.reasons).toEqual([
      expect.stringMatching(
        /^connector disco\/discord reconnecting: connection lost, resuming the session; next attempt at \d{4}-/,
      ),
    ])
    // one line for the outage, not one per attempt
    expect(gateway.logs.filter((line) => line.includes('disco/discord: reconnecting'))).toHaveLength(1)
    expect(discord.posts).toEqual([])

    discord.refuseConnections(false)
    const posts = await discord.waitForPosts(2)
    expect(posts.map((post) => post.content).sort()).toEqual(['echo: a DM meanwhile', 'echo: sent while you were away'])
    await gateway.waitForLog(
      /disco\/discord: connected \(session resumed, \d+ event\(s\) replayed, after [\d.]+ s down\)/,
    )
    expect(discord.identifies).toBe(1) // the same session, not a new one
    expect((await gateway.health()).body).toMatchObject({status: 'ok', connectors: {connected: 1}})
    await new Promise((resolve) => setTimeout(resolve, 300))
    expect(discord.posts).toHaveLength(2) // each once
  })

  it('a session Discord will not resume: a new one, and the state is connected again', async () => {
    const gateway = await gatewayWith({run: stubRun()})
    await gateway.waitForLog(/disco\/discord: connected/)
    discord.invalidateSessions()
    discord.dropConnections()
    await gateway.waitForLog(
      /disco\/discord: connected \(new session; messages sent while it was down were not replayed/,
    )
    expect(discord.identifies).toBe(2)
    expect((await gateway.health()).body).toMatchObject({status: 'ok', connectors: {connected: 1}})
    discord.userSays({channelId: '1001', content: 'new session'})
    expect((await discord.waitForPosts(1))[0]?.content).toBe('echo: new session')
  })

  it('with channels and mention_only: answers only @mentions in the listed channels, and every DM', async () => {
    const seen: string[] = []
    await gatewayWith({
      run: stubRun({onStart: (content) => seen.push(content)}),
      connector: {channels: ['1001'], mention_only: true},
    })
    await test!.waitForLog(/disco\/discord: connected/)
    const me = {id: discord.botUser.id, username: discord.botUser.username}
    discord.userSays({channelId: '1001', content: 'not for the bot'})
    discord.userSays({channelId: '1002', content: 'unlisted channel', mentions: [me]})
    discord.userSays({channelId: '1001', content: 'listed and mentioned', mentions: [me]})
    discord.userSays({channelId: '3001', content: 'a DM, no mention', guildId: null})
    await discord.waitForPosts(2)
    await new Promise((resolve) => setTimeout(resolve, 300))
    expect(seen).toEqual(['listed and mentioned', 'a DM, no mention'])
  })
})

describe('Discord connector stopping while it logs in', () => {
  const silentServer = async (): Promise<{port: number; connected: () => boolean; close(): void}> => {
    const sockets = new Set<net.Socket>()
    const server = net.createServer((socket) => sockets.add(socket.on('error', () => {})))
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve))
    return {
      port: (server.address() as net.AddressInfo).port,
      connected: () => sockets.size > 0,
      close: () => {
        for (const socket of sockets) socket.destroy()
        server.close()
      },
    }
  }

  async function stopTimeWhileLoggingIn(apiUrl: string, connected: () => boolean): Promise<number> {
    const gateway = await startTestGateway({
      agents: [{id: 'disco', connectors: [{type: 'discord', bot_token: TOKEN, guild_ids: [], api_url: apiUrl}]}],
      llmBaseUrl: llm.openaiBaseUrl,
      run: stubRun(),
    })
    await waitFor('discord.js to connect to the silent server', connected)
    const started = Date.now()
    await gateway.close()
    return Date.now() - started
  }

  it('stops the gateway within 3 s when the REST API accepts the connection and never answers', async () => {
    const silent = await silentServer()
    try {
      expect(await stopTimeWhileLoggingIn(`http://127.0.0.1:${silent.port}/api`, silent.connected)).toBeLessThan(3000)
    } finally {
      silent.close()
    }
  })

  /** Answers GET /gateway/bot with a websocket URL on `wsPort`, as Discord's REST API does. */
  async function gatewayInfoServer(wsPort: number): Promise<http.Server> {
    const api = http.createServer((_request, response) => {
      response.setHeader('content-type', 'application/json')
      response.end(
        JSON.stringify({
          url: `ws://127.0.0.1:${wsPort}`,
          shards: 1,
          session_start_limit: {total: 1000, remaining: 1000, reset_after: 0, max_concurrency: 1},
        }),
      )
    })
    await new Promise<void>((resolve) => api.listen(0, '127.0.0.1', resolve))
    return api
  }

  it('stops the gateway within 3 s when the Gateway websocket accepts the connection and never answers', async () => {
    const silent = await silentServer()
    const api = await gatewayInfoServer(silent.port)
    try {
      const {port} = api.address() as net.AddressInfo
      expect(await stopTimeWhileLoggingIn(`http://127.0.0.1:${port}/api`, silent.connected)).toBeLessThan(3000)
    } finally {
      api.closeAllConnections()
      api.close()
      silent.close()
    }
  })

  it('stops the gateway within 3 s when the websocket opens and then stays silent, close frames included', async () => {
    const sockets = new Set<net.Socket>()
    const upgrades = http.createServer()
    upgrades.on('upgrade', (request: http.IncomingMessage, socket: net.Socket) => {
      sockets.add(socket.on('error', () => {}))
      const accept = crypto
        .createHash('sha1')
        .update(`${request.headers['sec-websocket-key']}258EAFA5-E914-47DA-95CA-C5AB0DC85B11`)
        .digest('base64')
      socket.write(
        `HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: ${accept}\r\n\r\n`,
      )
    })
    await new Promise<void>((resolve) => upgrades.listen(0, '127.0.0.1', resolve))
    const api = await gatewayInfoServer((upgrades.address() as net.AddressInfo).port)
    try {
      const {port} = api.address() as net.AddressInfo
      expect(await stopTimeWhileLoggingIn(`http://127.0.0.1:${port}/api`, () => sockets.size > 0)).toBeLessThan(3000)
    } finally {
      for (const socket of sockets) socket.destroy()
      api.closeAllConnections()
      api.close()
      upgrades.close()
    }
  })
})
