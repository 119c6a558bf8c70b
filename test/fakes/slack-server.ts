/**
 * A fake Slack on 127.0.0.1 for the real @slack/socket-mode and @slack/web-api clients (both
 * pointed here with `slackApiUrl`): the Web API methods a bot uses (form-encoded or JSON,
 * `Authorization: Bearer`), `apps.connections.open` handing out a Socket Mode WebSocket, `hello`,
 * `events_api` envelopes that must be acknowledged with `{envelope_id, payload}`. An envelope not
 * acknowledged (sent while no connection was open, or on one that dropped) is delivered again to
 * the next connection, with `retry_attempt` counting up to Slack's 3 retries. A bot's post is
 * echoed back as a `message` event with `bot_id`, as Slack does for subscribed channels.
 * File uploads go the external way `files.uploadV2` takes: `files.getUploadURLExternal`, a POST of
 * the bytes to the URL it returns (here), `files.completeUploadExternal` sharing them to a channel.
 *
 *   const slack = await startFakeSlack({botToken: 'xoxb-1', appToken: 'xapp-1'})
 *   // connector config: {type: slack, bot_token: 'xoxb-1', app_token: 'xapp-1', api_url: slack.apiUrl}
 *   slack.userSays({channel: 'C1', text: 'hi'})
 *   const [reply] = await slack.waitForPosts(1)
 */
import {createServer, type IncomingMessage, type ServerResponse} from 'node:http'
import {WebSocketServer, type WebSocket} from 'ws'
import {createFakeFiles, type FakeFiles} from './fake-files.js'
import type {PlatformFaults} from './fake-http.js'
import {
  closeFakeServer,
  createFaults,
  createWaiters,
  listenOnLoopback,
  readBody,
  readRaw,
  sendJson,
} from './fake-http.js'

export interface SlackPost {
  channel: string
  text: string
  thread_ts?: string
  ts: string
  time: number
}

export interface SlackFileShare {
  channel: string
  thread_ts?: string
  files: Array<{id: string; name: string; data?: Buffer}>
}

export interface FakeSlack extends PlatformFaults {
  /** For `slackApiUrl` / the connector's `api_url` (ends in /api/). */
  readonly apiUrl: string
  readonly botUserId: string
  readonly posts: SlackPost[]
  /** Files served at `/files-pri/...` with the bot token (url_private: `slack.fileUrl(path)`), and their downloads. */
  readonly files: FakeFiles
  fileUrl(path: string): string
  /** Envelope ids the client acknowledged. */
  readonly acks: string[]
  /** Web API calls by method name, in order. */
  readonly calls: string[]
  readonly connections: number
  /** Socket Mode connections that got `hello`, in total. */
  readonly helloCount: number
  /** Sends a `message` event (or `app_mention` with `mention: true`); returns its ts. */
  userSays(message: {
    channel: string
    text: string
    user?: string
    thread_ts?: string
    mention?: boolean
    ts?: string
    /** Slack file objects: the event gets subtype file_share. */
    files?: Array<Record<string, unknown>>
    /** `im` for a direct message (default `channel`). */
    channel_type?: string
  }): string
  waitForPosts(count: number, timeoutMs?: number): Promise<SlackPost[]>
  waitForHelloCount(count: number, timeoutMs?: number): Promise<void>
  waitForCall(method: string, count?: number, timeoutMs?: number): Promise<void>
  dropConnections(): void
  /** While on, Socket Mode connections are cut before the upgrade (Slack unreachable); the Web API still answers. */
  refuseConnections(on: boolean): void
  /** While on, acknowledgements are lost on the way (the envelopes stay owed and are delivered again). */
  loseAcks(on: boolean): void
  /** Envelopes sent and not acknowledged. */
  readonly unacked: number
  /** Files shared with files.completeUploadExternal, in order. */
  readonly shares: SlackFileShare[]
  /** Answer files.getUploadURLExternal with this error (e.g. missing_scope) until cleared. */
  refuseUploadsWith(error: string | undefined): void
  close(): Promise<void>
}

/** Slack retries an unacknowledged event this many times. */
const MAX_RETRIES = 3

export async function startFakeSlack(options: {
  botToken: string
  appToken: string
  /** The bot token's scopes (auth.test's x-oauth-scopes); without files:read a file download gets the sign-in page. */
  scopes?: string[]
  /** False: auth.test does not name the scopes (the connector learns of a missing one only at the download). */
  announceScopes?: boolean
}): Promise<FakeSlack> {
  const scopes = options.scopes ?? ['chat:write', 'app_mentions:read', 'channels:history', 'users:read', 'files:read']
  const files = createFakeFiles()
  const botUserId = 'UBOT'
  const botId = 'BBOT'
  const posts: SlackPost[] = []
  const acks: string[] = []
  const calls: string[] = []
  const sockets = new Set<WebSocket>()
  let helloCount = 0
  let refusing = false
  let losingAcks = false
  const owed = new Map<string, {envelope: Record<string, unknown>; retries: number}>()
  const shares: SlackFileShare[] = []
  const uploads = new Map<string, {name: string; length: number; data?: Buffer}>()
  let uploadRefusal: string | undefined
  let sequence = 0
  const {notify, waitFor} = createWaiters('fake Slack')
  // a message's ts is its time, as on Slack (unique here by the sequence in its fraction)
  const nextTs = () => `${Math.floor(Date.now() / 1000)}.${String(++sequence).padStart(6, '0')}`

  function sendEnvelope(event: Record<string, unknown>): void {
    const envelopeId = `env-${++sequence}`
    const envelope = {
      envelope_id: envelopeId,
      type: 'events_api',
      accepts_response_payload: false,
      retry_attempt: 0,
      retry_reason: '',
      payload: {
        token: 'verification',
        team_id: 'T1',
        api_app_id: 'A1',
        type: 'event_callback',
        event_id: `Ev${sequence}`,
        event_time: Math.floor(Date.now() / 1000),
        event: {...event, event_ts: event.ts},
      },
    }
    owed.set(envelopeId, {envelope, retries: 0})
    const text = JSON.stringify(envelope)
    for (const socket of sockets) if (socket.readyState === socket.OPEN) socket.send(text)
  }

  /** What Slack does for an event nobody acknowledged: tries again on a connection it has. */
  function redeliver(socket: WebSocket): void {
    for (const [id, entry] of owed) {
      if (entry.retries >= MAX_RETRIES) {
        owed.delete(id)
        continue
      }
      entry.retries++
      socket.send(JSON.stringify({...entry.envelope, retry_attempt: entry.retries, retry_reason: 'timeout'}))
    }
  }

  async function readParams(req: IncomingMessage): Promise<Record<string, any>> {
    const body = await readBody(req)
    if (!body) return {}
    if ((req.headers['content-type'] ?? '').includes('application/json')) return JSON.parse(body)
    return Object.fromEntries(new URLSearchParams(body))
  }

  // the Web API answers HTTP 200 even for errors, with `ok: false`
  const reply = (res: ServerResponse, body: Record<string, unknown>) => sendJson(res, 200, body)

  const server = createServer(async (req, res) => {
    const url = new URL(req.url ?? '/', 'http://fake')
    if (url.pathname.startsWith('/files-pri/')) {
      if (!scopes.includes('files:read')) {
        res.writeHead(200, {'content-type': 'text/html; charset=utf-8'}).end('<html>Sign in to Slack</html>')
        return
      }
      if (!files.serve(req, res, req.headers.authorization === `Bearer ${options.botToken}`)) sendJson(res, 404, {})
      notify()
      return
    }
    const method = url.pathname.replace(/^\/api\//, '')
    calls.push(method)
    notify()
    const uploadPath = /^\/upload\/(F\w+)$/.exec(url.pathname)
    if (uploadPath) {
      // the URL getUploadURLExternal handed out: multipart, the bytes in field `body`
      const upload = uploads.get(uploadPath[1] as string)
      const raw = await readRaw(req)
      const form = await new Response(new Uint8Array(raw), {
        headers: {'content-type': String(req.headers['content-type'])},
      }).formData()
      const part = form.get('body') ?? form.get('file')
      if (!upload || !part || typeof part === 'string') return sendJson(res, 400, {error: 'bad upload'})
      upload.data = Buffer.from(await part.arrayBuffer())
      res.writeHead(200, {'content-type': 'text/plain'})
      return res.end(`OK - ${upload.data.length}`)
    }
    const params = await readParams(req)
    const token = /^Bearer (.+)$/.exec(req.headers.authorization ?? '')?.[1] ?? params.token
    const botAuthed = token === options.botToken
    switch (method) {
      case 'auth.test':
        if (options.announceScopes !== false) res.setHeader('x-oauth-scopes', scopes.join(','))
        return reply(
          res,
          botAuthed
            ? {
                ok: true,
                url: 'https://fake.slack.com/',
                team: 'Test Team',
                user: 'meepabot',
                team_id: 'T1',
                user_id: botUserId,
                bot_id: botId,
              }
            : {ok: false, error: 'invalid_auth'},
        )
      case 'apps.connections.open':
        if (token !== options.appToken) return reply(res, {ok: false, error: 'invalid_auth'})
        return reply(res, {ok: true, url: `ws://127.0.0.1:${port}/link/?ticket=t${++sequence}`})
      case 'users.info':
        if (!botAuthed) return reply(res, {ok: false, error: 'invalid_auth'})
        return reply(res, {
          ok: true,
          user: {id: params.user, name: 'alice', real_name: 'Alice Example', profile: {display_name: 'alice'}},
        })
      case 'chat.postMessage': {
        if (!botAuthed) return reply(res, {ok: false, error: 'invalid_auth'})
        const failure = platformFaults.faults.next(String(params.channel))
        if (failure)
          return sendJson(
            res,
            failure.status,
            {ok: false, error: failure.status === 429 ? 'ratelimited' : 'fatal_error'},
            {
              ...(failure.retryAfterSeconds !== undefined ? {'retry-after': String(failure.retryAfterSeconds)} : {}),
            },
          )
        if (!params.channel) return reply(res, {ok: false, error: 'channel_not_found'})
        if (!params.text) return reply(res, {ok: false, error: 'no_text'})
        if (String(params.text).length > 40_000) return reply(res, {ok: false, error: 'msg_too_long'})
        const ts = nextTs()
        const post: SlackPost = {
          channel: params.channel,
          text: params.text,
          ts,
          time: Date.now(),
          ...(params.thread_ts ? {thread_ts: params.thread_ts} : {}),
        }
        posts.push(post)
        const message = {
          type: 'message',
          subtype: 'bot_message',
          text: params.text,
          user: botUserId,
          bot_id: botId,
          ts,
          ...(params.thread_ts ? {thread_ts: params.thread_ts} : {}),
        }
        reply(res, {ok: true, channel: params.channel, ts, message})
        sendEnvelope({...message, channel: params.channel, channel_type: 'channel'})
        notify()
        return
      }
      case 'files.getUploadURLExternal': {
        if (!botAuthed) return reply(res, {ok: false, error: 'invalid_auth'})
        if (uploadRefusal)
          return reply(res, {
            ok: false,
            error: uploadRefusal,
            ...(uploadRefusal === 'missing_scope' ? {needed: 'files:write', provided: 'chat:write'} : {}),
          })
        if (!params.filename || !params.length) return reply(res, {ok: false, error: 'invalid_arguments'})
        const fileId = `F${++sequence}`
        uploads.set(fileId, {name: params.filename, length: Number(params.length)})
        return reply(res, {ok: true, upload_url: `http://127.0.0.1:${port}/upload/${fileId}`, file_id: fileId})
      }
      case 'files.completeUploadExternal': {
        if (!botAuthed) return reply(res, {ok: false, error: 'invalid_auth'})
        const listed = (typeof params.files === 'string' ? JSON.parse(params.files) : params.files) as Array<{
          id: string
        }>
        const files = listed.map(({id}) => ({id, name: uploads.get(id)?.name ?? '', data: uploads.get(id)?.data}))
        if (files.some((file) => !file.data)) return reply(res, {ok: false, error: 'file_not_found'})
        shares.push({channel: params.channel_id, ...(params.thread_ts ? {thread_ts: params.thread_ts} : {}), files})
        notify()
        return reply(res, {ok: true, files: files.map(({id, name}) => ({id, name, title: name}))})
      }
      default:
        return reply(res, {ok: false, error: 'unknown_method'})
    }
  })

  const wss = new WebSocketServer({noServer: true})
  server.on('upgrade', (req, socket, head) => {
    if (!(req.url ?? '').startsWith('/link/') || refusing) {
      socket.destroy()
      return
    }
    wss.handleUpgrade(req, socket, head, (ws) => {
      sockets.add(ws)
      ws.on('close', () => {
        sockets.delete(ws)
        notify()
      })
      ws.on('message', (data) => {
        try {
          const frame = JSON.parse(String(data))
          if (frame.envelope_id && !losingAcks) {
            acks.push(frame.envelope_id)
            owed.delete(frame.envelope_id)
          }
        } catch {
          // ignore
        }
        notify()
      })
      ws.send(
        JSON.stringify({
          type: 'hello',
          num_connections: sockets.size,
          debug_info: {host: 'fake', approximate_connection_time: 18060},
          connection_info: {app_id: 'A1'},
        }),
      )
      helloCount++
      redeliver(ws)
      notify()
    })
  })

  const port = await listenOnLoopback(server)
  const platformFaults = createFaults(server, () => port, sockets, notify)

  return {
    apiUrl: `http://127.0.0.1:${port}/api/`,
    botUserId,
    posts,
    files,
    fileUrl: (path) => `http://127.0.0.1:${port}${path}`,
    acks,
    calls,
    get connections() {
      return sockets.size
    },
    get helloCount() {
      return helloCount
    },
    userSays(message) {
      const ts = message.ts ?? nextTs()
      const base = {
        user: message.user ?? 'UALICE',
        text: message.text,
        ts,
        channel: message.channel,
        ...(message.thread_ts ? {thread_ts: message.thread_ts} : {}),
        ...(message.files ? {subtype: 'file_share', files: message.files} : {}),
      }
      sendEnvelope({
        type: message.mention ? 'app_mention' : 'message',
        ...base,
        channel_type: message.channel_type ?? 'channel',
      })
      return ts
    },
    async waitForPosts(count, timeoutMs = 20_000) {
      await waitFor(
        () => posts.length >= count,
        timeoutMs,
        () => `${count} posts (have ${posts.length})`,
      )
      return posts.slice(0, count)
    },
    waitForHelloCount(count, timeoutMs = 10_000) {
      return waitFor(
        () => helloCount >= count,
        timeoutMs,
        () => `${count} hello (sent ${helloCount})`,
      )
    },
    waitForCall(method, count = 1, timeoutMs = 10_000) {
      return waitFor(
        () => calls.filter((call) => call === method).length >= count,
        timeoutMs,
        () => `${count} × ${method} (calls: ${calls.join(', ')})`,
      )
    },
    shares,
    refuseUploadsWith(error) {
      uploadRefusal = error
    },
    dropConnections() {
      for (const socket of sockets) socket.terminate()
    },
    refuseConnections(on) {
      refusing = on
    },
    loseAcks(on) {
      losingAcks = on
    },
    get unacked() {
      return owed.size
    },
    ...platformFaults,
    close: () => closeFakeServer(server, {wss, sockets}),
  }
}
