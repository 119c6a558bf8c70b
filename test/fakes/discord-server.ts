/**
 * A fake Discord on 127.0.0.1 for the real discord.js client: the REST API (`/api/v10/...`,
 * `Authorization: Bot <token>`) and a Gateway v10 WebSocket (HELLO, IDENTIFY → READY and one
 * GUILD_CREATE per guild, heartbeat ACKs, RESUME → the events the session missed, then RESUMED,
 * MESSAGE_CREATE dispatches). A bot's post is dispatched back to it as MESSAGE_CREATE, as Discord
 * does. Message ids are snowflakes of their creation time, as discord.js reads them.
 *
 *   const discord = await startFakeDiscord({token: 'bot.token'})
 *   // connector config: {type: discord, bot_token: 'bot.token', guild_ids: [], api_url: discord.apiUrl}
 *   discord.userSays({channelId: 'c1', content: 'hi'})
 *   const [reply] = await discord.waitForPosts(1)
 */
import {createFakeFiles, type FakeFiles} from './fake-files.js'
import {createServer} from 'node:http'
import {WebSocketServer, type WebSocket} from 'ws'
import type {PlatformFaults} from './fake-http.js'
import {closeFakeServer, createFaults, createWaiters, listenOnLoopback, readRaw, sendJson} from './fake-http.js'

function parseJson(raw: Buffer): any {
  try {
    return JSON.parse(raw.toString('utf8'))
  } catch {
    return undefined
  }
}

/** discord.js sends files as multipart: `payload_json` plus `files[n]` parts. */
async function readMultipartMessage(
  raw: Buffer,
  contentType: string,
): Promise<{body: any; attachments: Array<{name: string; data: Buffer}>}> {
  const form = await new Response(new Uint8Array(raw), {headers: {'content-type': contentType}}).formData()
  const attachments: Array<{name: string; data: Buffer}> = []
  let body: any
  for (const [key, value] of form as unknown as Iterable<[string, string | File]>) {
    if (key === 'payload_json' && typeof value === 'string') body = JSON.parse(value)
    else if (/^files\[\d+\]$/.test(key) && typeof value !== 'string')
      attachments.push({name: value.name, data: Buffer.from(await value.arrayBuffer())})
  }
  return {body, attachments}
}

export interface DiscordPost {
  channelId: string
  content: string
  id: string
  time: number
  /** Files of a multipart post (`files[n]` parts), with their bytes. */
  attachments?: Array<{name: string; data: Buffer}>
}

export interface FakeDiscord extends PlatformFaults {
  /** For discord.js `rest.api` / the connector's `api_url`. */
  readonly apiUrl: string
  readonly botUser: {id: string; username: string}
  readonly posts: DiscordPost[]
  /** Attachments served like Discord's CDN (no token) at `/attachments/...`: `discord.cdnUrl(path)`. */
  readonly files: FakeFiles
  cdnUrl(path: string): string
  /** Channel ids the bot sent a typing pulse to, in order. */
  readonly typing: string[]
  readonly identifies: number
  readonly resumes: number
  /** REST calls refused for a bad token. */
  readonly refused: number
  readonly connections: number
  /** Dispatches MESSAGE_CREATE from a human (or `author` you pass); returns the message id. */
  userSays(message: {
    channelId: string
    content: string
    guildId?: string | null
    author?: {id: string; username: string; bot?: boolean}
    /** Discord attachment objects ({id, filename, size, url, content_type}). */
    attachments?: Array<Record<string, unknown>>
    /** Users the message @mentions. */
    mentions?: Array<{id: string; username: string}>
  }): string
  waitForPosts(count: number, timeoutMs?: number): Promise<DiscordPost[]>
  waitFor(check: () => boolean, what: string, timeoutMs?: number): Promise<void>
  dropConnections(): void
  /** While on, Gateway connections are cut before the upgrade (Discord unreachable); REST still answers. */
  refuseConnections(on: boolean): void
  /** Every session so far is over: a RESUME gets op 9 (invalid session, not resumable). */
  invalidateSessions(): void
  /** Multipart posts bigger than this are answered 413 (Discord's upload limit). */
  limitUploads(bytes: number | undefined): void
  close(): Promise<void>
}

export interface FakeDiscordGuild {
  id: string
  name: string
  channels: Array<{id: string; name: string}>
}

const DEFAULT_GUILDS: FakeDiscordGuild[] = [
  {
    id: '100',
    name: 'Test Guild',
    channels: [
      {id: '1001', name: 'general'},
      {id: '1002', name: 'random'},
    ],
  },
  {id: '200', name: 'Other Guild', channels: [{id: '2001', name: 'elsewhere'}]},
]

interface Session {
  id: string
  sequence: number
  socket?: WebSocket
  /** Dispatches so far, replayed after the sequence a RESUME names. */
  sent: Array<{op: 0; t: string; s: number; d: unknown}>
  invalid?: boolean
}

/** Discord's epoch (2015-01-01), the origin of snowflake timestamps. */
const DISCORD_EPOCH = 1_420_070_400_000n

export async function startFakeDiscord(options: {token: string; guilds?: FakeDiscordGuild[]}): Promise<FakeDiscord> {
  const guilds = options.guilds ?? DEFAULT_GUILDS
  const botUser = {id: '900', username: 'meepabot', discriminator: '0', global_name: null, avatar: null, bot: true}
  const human = {id: '500', username: 'alice', discriminator: '0', global_name: 'Alice', avatar: null}
  const posts: DiscordPost[] = []
  const typing: string[] = []
  const sessions = new Map<string, Session>()
  const sockets = new Set<WebSocket>()
  let identifies = 0
  let uploadLimit: number | undefined
  let resumes = 0
  let refused = 0
  let refusing = false
  let increment = 0n
  const newSnowflake = () => String(((BigInt(Date.now()) - DISCORD_EPOCH) << 22n) | (++increment & 0xfffn))
  const {notify, waitFor} = createWaiters('fake Discord')
  /** A DM channel with the human: not in any guild, so not announced at READY (as on Discord). */
  const dmChannelId = '3001'
  const guildOf = (channelId: string) =>
    guilds.find((guild) => guild.channels.some((channel) => channel.id === channelId))

  function messageObject(fields: {id: string; channelId: string; content: string; author: any}) {
    const guild = guildOf(fields.channelId)
    return {
      id: fields.id,
      type: 0,
      channel_id: fields.channelId,
      // Discord sends the channel type with every message: discord.js needs it to build an uncached DM channel
      channel_type: guild ? 0 : 1,
      ...(guild ? {guild_id: guild.id} : {}),
      author: fields.author,
      content: fields.content,
      timestamp: new Date().toISOString(),
      edited_timestamp: null,
      tts: false,
      mention_everyone: false,
      mentions: [],
      mention_roles: [],
      attachments: [],
      embeds: [],
      pinned: false,
      flags: 0,
    }
  }

  /** To every live session: sent now if connected, replayed on RESUME if not (as Discord keeps a session's events). */
  function dispatch(t: string, d: unknown): void {
    for (const session of sessions.values()) {
      if (session.invalid) continue
      const payload = {op: 0 as const, t, s: ++session.sequence, d}
      session.sent.push(payload)
      const socket = session.socket
      if (socket && socket.readyState === socket.OPEN) socket.send(JSON.stringify(payload))
    }
  }

  const files = createFakeFiles()
  const server = createServer(async (req, res) => {
    const url = new URL(req.url ?? '/', 'http://fake')
    if (url.pathname.startsWith('/attachments/') && files.serve(req, res, true)) return notify()
    if (req.headers.authorization !== `Bot ${options.token}`) {
      refused++
      notify()
      return sendJson(res, 401, {message: '401: Unauthorized', code: 0})
    }
    const path = url.pathname.replace(/^\/api\/v10/, '')
    if (req.method === 'GET' && path === '/gateway/bot') {
      return sendJson(res, 200, {
        url: `ws://127.0.0.1:${port}/gateway`,
        shards: 1,
        session_start_limit: {total: 1000, remaining: 999, reset_after: 0, max_concurrency: 1},
      })
    }
    if (req.method === 'GET' && path === `/channels/${dmChannelId}`) {
      return sendJson(res, 200, {id: dmChannelId, type: 1, last_message_id: null, recipients: [human]})
    }
    const typingMatch = /^\/channels\/(\d+)\/typing$/.exec(path)
    if (req.method === 'POST' && typingMatch) {
      typing.push(typingMatch[1] as string)
      notify()
      return sendJson(res, 204)
    }
    const postMatch = /^\/channels\/(\d+)\/messages$/.exec(path)
    if (req.method === 'POST' && postMatch) {
      const channelId = postMatch[1] as string
      const multipart = String(req.headers['content-type']).startsWith('multipart/form-data')
      const raw = await readRaw(req)
      if (multipart && uploadLimit !== undefined && raw.length > uploadLimit)
        return sendJson(res, 413, {message: 'Request entity too large', code: 40005})
      const {body, attachments} = multipart
        ? await readMultipartMessage(raw, String(req.headers['content-type']))
        : {body: parseJson(raw), attachments: []}
      const failure = platformFaults.faults.next(channelId)
      if (failure?.status === 429) {
        // as Discord: the wait in Retry-After and in the body, scoped to the route's bucket
        return sendJson(
          res,
          429,
          {message: 'You are being rate limited.', retry_after: failure.retryAfterSeconds ?? 1, global: false},
          {'retry-after': String(failure.retryAfterSeconds ?? 1), 'x-ratelimit-scope': 'user'},
        )
      }
      if (failure)
        return sendJson(
          res,
          failure.status,
          {message: 'scripted failure', code: 0},
          {
            ...(failure.retryAfterSeconds !== undefined ? {'retry-after': String(failure.retryAfterSeconds)} : {}),
          },
        )
      if (!guildOf(channelId) && channelId !== dmChannelId)
        return sendJson(res, 404, {message: 'Unknown Channel', code: 10003})
      if (!body?.content && attachments.length === 0)
        return sendJson(res, 400, {message: 'Cannot send an empty message', code: 50006})
      if (String(body.content).length > 2000) {
        return sendJson(res, 400, {
          message: 'Invalid Form Body',
          code: 50035,
          errors: {content: {_errors: [{code: 'BASE_TYPE_MAX_LENGTH', message: 'Must be 2000 or fewer in length.'}]}},
        })
      }
      const id = newSnowflake()
      const content = String(body?.content ?? '')
      posts.push({channelId, content, id, time: Date.now(), ...(attachments.length > 0 ? {attachments} : {})})
      const message = messageObject({id, channelId, content, author: botUser})
      sendJson(res, 200, message)
      dispatch('MESSAGE_CREATE', message)
      notify()
      return
    }
    return sendJson(res, 404, {message: '404: Not Found', code: 0})
  })

  const wss = new WebSocketServer({noServer: true})
  server.on('upgrade', (req, socket, head) => {
    if (!(req.url ?? '').startsWith('/gateway') || refusing) {
      socket.destroy()
      return
    }
    wss.handleUpgrade(req, socket, head, (ws) => {
      sockets.add(ws)
      let session: Session | undefined
      ws.on('close', () => {
        sockets.delete(ws)
        if (session?.socket === ws) session.socket = undefined
        notify()
      })
      ws.on('message', (data) => {
        let payload: any
        try {
          payload = JSON.parse(String(data))
        } catch {
          ws.close(4002, 'Decode error')
          return
        }
        switch (payload.op) {
          case 1:
            ws.send(JSON.stringify({op: 11}))
            return
          case 2: {
            if (payload.d?.token !== options.token) {
              ws.close(4004, 'Authentication failed.')
              return
            }
            identifies++
            session = {id: `session-${identifies}`, sequence: 0, socket: ws, sent: []}
            sessions.set(session.id, session)
            const send = (t: string, d: unknown) => {
              const payload = {op: 0 as const, t, s: ++(session as Session).sequence, d}
              ;(session as Session).sent.push(payload)
              ws.send(JSON.stringify(payload))
            }
            send('READY', {
              v: 10,
              user: botUser,
              guilds: guilds.map((guild) => ({id: guild.id, unavailable: true})),
              session_id: session.id,
              resume_gateway_url: `ws://127.0.0.1:${port}/gateway`,
              application: {id: '901', flags: 0},
              private_channels: [],
            })
            for (const guild of guilds) {
              send('GUILD_CREATE', {
                id: guild.id,
                name: guild.name,
                unavailable: false,
                owner_id: human.id,
                member_count: 2,
                roles: [],
                emojis: [],
                members: [],
                channels: guild.channels.map((channel, position) => ({
                  id: channel.id,
                  type: 0,
                  name: channel.name,
                  position,
                  guild_id: guild.id,
                })),
                threads: [],
              })
            }
            notify()
            return
          }
          case 6: {
            const resumed = sessions.get(payload.d?.session_id)
            if (!resumed || resumed.invalid || payload.d?.token !== options.token) {
              ws.send(JSON.stringify({op: 9, d: false}))
              return
            }
            resumes++
            session = resumed
            session.socket = ws
            const after = Number(payload.d?.seq ?? 0)
            for (const missed of session.sent) if (missed.s > after) ws.send(JSON.stringify(missed))
            ws.send(JSON.stringify({op: 0, t: 'RESUMED', s: ++session.sequence, d: {}}))
            notify()
            return
          }
          default:
            return
        }
      })
      ws.send(JSON.stringify({op: 10, d: {heartbeat_interval: 41_250}}))
    })
  })

  const port = await listenOnLoopback(server)
  const platformFaults = createFaults(server, () => port, sockets, notify)

  return {
    apiUrl: `http://127.0.0.1:${port}/api`,
    botUser,
    posts,
    files,
    cdnUrl: (path) => `http://127.0.0.1:${port}${path}`,
    typing,
    get identifies() {
      return identifies
    },
    get resumes() {
      return resumes
    },
    get refused() {
      return refused
    },
    get connections() {
      return sockets.size
    },
    userSays(message) {
      const id = newSnowflake()
      const fields = messageObject({
        id,
        channelId: message.channelId,
        content: message.content,
        author: message.author ?? human,
      })
      if (message.attachments) (fields as {attachments?: unknown[]}).attachments = message.attachments
      if (message.mentions)
        (fields as {mentions: unknown[]}).mentions = message.mentions.map((user) => ({discriminator: '0', ...user}))
      if (message.guildId !== undefined) {
        if (message.guildId === null) delete (fields as {guild_id?: string}).guild_id
        else (fields as {guild_id?: string}).guild_id = message.guildId
      }
      dispatch('MESSAGE_CREATE', fields)
      return id
    },
    async waitForPosts(count, timeoutMs = 20_000) {
      await waitFor(
        () => posts.length >= count,
        timeoutMs,
        () => `${count} posts (have ${posts.length})`,
      )
      return posts.slice(0, count)
    },
    waitFor: (check, what, timeoutMs = 20_000) => waitFor(check, timeoutMs, what),
    limitUploads(bytes) {
      uploadLimit = bytes
    },
    dropConnections() {
      for (const socket of sockets) socket.terminate()
    },
    refuseConnections(on) {
      refusing = on
    },
    invalidateSessions() {
      for (const session of sessions.values()) session.invalid = true
    },
    ...platformFaults,
    close: () => closeFakeServer(server, {wss, sockets}),
  }
}
