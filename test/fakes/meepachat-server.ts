/**
 * A fake MeepaChat server on 127.0.0.1 speaking the bot protocol: the bot gateway WebSocket
 * (`GET /api/bot-gateway`, `Authorization: Bot <token>`, `{type, data}` frames, `ready`,
 * `message.created`, `ping`→`pong`, `typing`) and the REST calls a bot replies with, uploads
 * included (`POST /api/attachments/presign`, multipart `PUT /api/attachments/upload/{id}`, then
 * `attachmentIds` on the message). Like the real server, a message the bot posts is broadcast back
 * to it as `message.created`.
 *
 *   const chat = await startFakeMeepaChat({token: '1.secret'})
 *   // connector config: {type: meepachat, url: chat.gatewayUrl, bot_token: '1.secret'}
 *   chat.userSays({channelId: 'general', content: 'hi'})
 *   const [reply] = await chat.waitForPosts(1)
 */
import {createServer, type IncomingMessage, type Server, type ServerResponse} from 'node:http'
import {createServer as createHttpsServer} from 'node:https'
import {WebSocketServer, type WebSocket} from 'ws'
import type {PlatformFaults} from './fake-http.js'
import {
  closeFakeServer,
  createFaults,
  createWaiters,
  listenOnLoopback,
  readJson,
  readRaw,
  sendJson,
} from './fake-http.js'
import {createFakeFiles, type FakeFiles} from './fake-files.js'

export interface FakeChannel {
  id: string
  serverId: string | null
  name: string
  isDm: boolean
}

export interface PostedMessage {
  id: string
  channelId: string
  serverId: string | null
  threadId?: string
  content: string
  path: string
  time: number
  /** The uploads its attachmentIds named, with the bytes the server received. */
  attachments?: FakeUpload[]
}

export interface FakeUpload {
  id: string
  filename: string
  mimeType: string
  /** Set once the multipart PUT arrived. */
  data?: Buffer
  /** The multipart part's own file name. */
  partName?: string
}

export interface ClientFrame {
  type: string
  data?: any
  time: number
}

export interface FakeMeepaChat extends PlatformFaults {
  /** `ws://127.0.0.1:PORT/api/bot-gateway` (`wss://` over TLS) */
  readonly gatewayUrl: string
  readonly botUser: {id: string; username: string; displayName: string; bot: true}
  readonly posts: PostedMessage[]
  /** Attachments the server holds (`files.add('/uploads/a.png', {body})`, storedPath `uploads/a.png`) and their downloads. */
  readonly files: FakeFiles
  /** Every HTTP request the bot made (not its WebSocket upgrade), path and query as sent. */
  readonly requests: Array<{method: string; url: string}>
  /** Frames the bot sent (ping, typing, ...). */
  readonly frames: ClientFrame[]
  /** WebSocket upgrades refused for a bad token. */
  readonly refused: number
  /** Open bot connections. */
  readonly connections: number
  /** Sends `message.created` from a human (or `user` you pass) to every connected bot; returns the message id. */
  userSays(message: {
    channelId: string
    content: string
    id?: string
    threadId?: string
    user?: {id: string; username: string; bot?: boolean}
    attachments?: Array<{filename: string; storedPath: string; mimeType?: string; sizeBytes?: number}>
    /** Users the message @mentions, as the server lists them. */
    mentions?: Array<{id: string}>
  }): string
  waitForPosts(count: number, timeoutMs?: number): Promise<PostedMessage[]>
  waitForConnections(count: number, timeoutMs?: number): Promise<void>
  /** Total successful connections (ready frames sent) so far. */
  readonly readyCount: number
  waitForReadyCount(count: number, timeoutMs?: number): Promise<void>
  /** Cuts every bot connection without a close handshake (a network drop). */
  dropConnections(): void
  /** While on, the bot gateway answers 503 (a server restarting behind its proxy); a message meanwhile reaches no bot. */
  refuseConnections(on: boolean): void
  /** Sends any frame (or raw text) to every connected bot. */
  sendRaw(frame: unknown): void
  /** Current connections stop getting pongs and events (a connection that died silently). */
  stopAnswering(): void
  /** Uploads bigger than this are answered 413 (as a server's body limit would). */
  limitUploads(bytes: number | undefined): void
  /** Every presigned upload, in order. */
  readonly uploads: FakeUpload[]
  close(): Promise<void>
}

export interface FakeMeepaChatOptions {
  token: string
  port?: number
  /** Serve over TLS (wss://, https://) with this key and certificate (PEM). */
  tls?: {key: string; cert: string}
}

const HUMAN = {id: 'user-1', username: 'alice', displayName: 'Alice', status: 'online', bot: false}

export async function startFakeMeepaChat(options: FakeMeepaChatOptions): Promise<FakeMeepaChat> {
  const botUser = {id: 'bot-1', username: 'meepabot', displayName: 'Meepa Bot', bot: true as const}
  const channels: FakeChannel[] = [
    {id: 'general', serverId: 'server-1', name: 'general', isDm: false},
    {id: 'random', serverId: 'server-1', name: 'random', isDm: false},
    {id: 'dm-alice', serverId: null, name: 'alice', isDm: true},
  ]
  const posts: PostedMessage[] = []
  const frames: ClientFrame[] = []
  const requests: FakeMeepaChat['requests'] = []
  const sockets = new Set<WebSocket>()
  const muted = new WeakSet<WebSocket>()
  let refused = 0
  let readyCount = 0
  let nextId = 1
  let refusing = false
  let uploadLimit: number | undefined
  const uploads: FakeUpload[] = []
  const {notify, waitFor} = createWaiters('fake MeepaChat')

  const authorized = (req: IncomingMessage) => req.headers.authorization === `Bot ${options.token}`

  function messageObject(fields: {
    id: string
    channelId: string
    content: string
    threadId?: string
    user: any
    attachments?: any[]
  }) {
    const now = new Date().toISOString()
    return {
      id: fields.id,
      channelId: fields.channelId,
      userId: fields.user.id,
      ...(fields.threadId ? {threadId: fields.threadId} : {}),
      content: fields.content,
      edited: false,
      createdAt: now,
      updatedAt: now,
      user: {status: 'online', displayName: fields.user.username, ...fields.user},
      ...(fields.attachments
        ? {
            attachments: fields.attachments.map((attachment, index) => ({
              id: `att-${fields.id}-${index}`,
              messageId: fields.id,
              createdAt: now,
              ...attachment,
            })),
          }
        : {}),
    }
  }

  function broadcast(frame: unknown): void {
    const text = JSON.stringify(frame)
    for (const socket of sockets) if (socket.readyState === socket.OPEN && !muted.has(socket)) socket.send(text)
  }

  const files = createFakeFiles()
  const handle = async (req: IncomingMessage, res: ServerResponse) => {
    requests.push({method: req.method ?? '', url: req.url ?? ''})
    const url = new URL(req.url ?? '/', 'http://fake')
    if (files.serve(req, res, authorized(req))) return notify()
    if (!authorized(req)) return sendJson(res, 401, {error: 'unauthorized'})
    if (req.method === 'POST' && url.pathname === '/api/attachments/presign') {
      const body = await readJson(req)
      if (typeof body?.filename !== 'string' || typeof body?.mimeType !== 'string')
        return sendJson(res, 400, {error: 'filename and mimeType are required'})
      const upload: FakeUpload = {id: `up${nextId++}`, filename: body.filename, mimeType: body.mimeType}
      uploads.push(upload)
      const uploadUrl = `http://${req.headers.host}/api/attachments/upload/${upload.id}`
      return sendJson(res, 200, {data: {uploadId: upload.id, uploadUrl}})
    }
    const uploadPath = /^\/api\/attachments\/upload\/([^/]+)$/.exec(url.pathname)
    if (req.method === 'PUT' && uploadPath) {
      const upload = uploads.find((candidate) => candidate.id === decodeURIComponent(uploadPath[1] as string))
      const raw = await readRaw(req)
      if (!upload) return sendJson(res, 404, {error: 'unknown upload'})
      if (uploadLimit !== undefined && raw.length > uploadLimit)
        return sendJson(res, 413, {error: 'request entity too large'})
      const form = await new Response(new Uint8Array(raw), {
        headers: {'content-type': String(req.headers['content-type'])},
      })
        .formData()
        .catch(() => undefined)
      const file = form?.get('file')
      if (!file || typeof file === 'string') return sendJson(res, 400, {error: 'multipart field "file" is required'})
      upload.data = Buffer.from(await file.arrayBuffer())
      upload.partName = file.name
      return sendJson(res, 200, {data: {uploadId: upload.id}})
    }
    const serverChannel = /^\/api\/servers\/([^/]+)\/channels\/([^/]+)\/messages$/.exec(url.pathname)
    const dmChannel = /^\/api\/dms\/([^/]+)\/messages$/.exec(url.pathname)
    if (req.method !== 'POST' || (!serverChannel && !dmChannel)) return sendJson(res, 404, {error: 'not found'})
    const channelId = decodeURIComponent((serverChannel?.[2] ?? dmChannel?.[1]) as string)
    const serverId = serverChannel ? decodeURIComponent(serverChannel[1] as string) : null
    const channel = channels.find((candidate) => candidate.id === channelId)
    if (!channel || channel.serverId !== serverId) return sendJson(res, 404, {error: 'channel not found'})
    const body = await readJson(req)
    const failure = platformFaults.faults.next(channelId)
    if (failure)
      return sendJson(
        res,
        failure.status,
        {error: failure.status === 429 ? 'rate limited' : 'scripted failure'},
        {
          ...(failure.retryAfterSeconds !== undefined ? {'retry-after': String(failure.retryAfterSeconds)} : {}),
        },
      )
    if (!body || typeof body.content !== 'string' || !body.content)
      return sendJson(res, 400, {error: 'content is required'})
    if (body.content.length > 4000) return sendJson(res, 400, {error: 'content exceeds 4000 characters'})
    const ids: unknown[] = Array.isArray(body.attachmentIds) ? body.attachmentIds : []
    const attached = ids.map((uploadId) => uploads.find((upload) => upload.id === uploadId && upload.data))
    if (attached.some((upload) => !upload)) return sendJson(res, 400, {error: 'unknown attachment id'})
    const id = `m${nextId++}`
    const post: PostedMessage = {
      id,
      channelId,
      serverId,
      content: body.content,
      path: url.pathname,
      time: Date.now(),
      ...(body.threadId ? {threadId: body.threadId} : {}),
      ...(attached.length > 0 ? {attachments: attached as FakeUpload[]} : {}),
    }
    posts.push(post)
    const message = messageObject({id, channelId, content: body.content, threadId: body.threadId, user: botUser})
    sendJson(res, 201, {data: message})
    broadcast({type: 'message.created', data: message}) // bots see their own messages, as on the real server
    notify()
  }
  const server: Server = options.tls ? createHttpsServer(options.tls, handle) : createServer(handle)

  const wss = new WebSocketServer({noServer: true})
  server.on('upgrade', (req, socket, head) => {
    const url = new URL(req.url ?? '/', 'http://fake')
    if (refusing) {
      socket.end('HTTP/1.1 503 Service Unavailable\r\nconnection: close\r\ncontent-length: 0\r\n\r\n')
      return
    }
    if (url.pathname !== '/api/bot-gateway' || !authorized(req)) {
      if (url.pathname === '/api/bot-gateway') refused++
      socket.end(
        'HTTP/1.1 401 Unauthorized\r\ncontent-type: application/json\r\nconnection: close\r\n\r\n{"error":"unauthorized"}',
      )
      notify()
      return
    }
    wss.handleUpgrade(req, socket, head, (ws) => {
      sockets.add(ws)
      ws.on('close', () => {
        sockets.delete(ws)
        notify()
      })
      ws.on('message', (data) => {
        let frame: any
        try {
          frame = JSON.parse(String(data))
        } catch {
          return
        }
        frames.push({...frame, time: Date.now()})
        if (frame.type === 'ping' && !muted.has(ws)) ws.send(JSON.stringify({type: 'pong'}))
        notify()
      })
      ws.send(
        JSON.stringify({
          type: 'ready',
          data: {
            user: {...botUser, status: 'online', createdAt: new Date().toISOString()},
            servers: [
              {
                id: 'server-1',
                name: 'Test Server',
                channels: channels.filter((channel) => channel.serverId === 'server-1').map(channelObject),
              },
            ],
            dmChannels: channels.filter((channel) => channel.isDm).map(channelObject),
          },
        }),
      )
      readyCount++
      notify()
    })
  })

  function channelObject(channel: FakeChannel) {
    return {
      id: channel.id,
      serverId: channel.serverId,
      name: channel.name,
      displayName: channel.name,
      topic: null,
      isDm: channel.isDm,
      isPrivate: channel.isDm,
    }
  }

  const port = await listenOnLoopback(server, options.port)
  const platformFaults = createFaults(server, () => port, sockets, notify)

  return {
    gatewayUrl: `${options.tls ? 'wss' : 'ws'}://127.0.0.1:${port}/api/bot-gateway`,
    botUser,
    posts,
    files,
    requests,
    frames,
    get refused() {
      return refused
    },
    get connections() {
      return sockets.size
    },
    get readyCount() {
      return readyCount
    },
    userSays(message) {
      const id = message.id ?? `u${nextId++}`
      const data = {
        ...messageObject({
          id,
          channelId: message.channelId,
          content: message.content,
          threadId: message.threadId,
          user: message.user ?? HUMAN,
          attachments: message.attachments,
        }),
      }
      broadcast({type: 'message.created', data: {...data, ...(message.mentions ? {mentions: message.mentions} : {})}})
      return id
    },
    async waitForPosts(count, timeoutMs = 20_000) {
      await waitFor(
        () => posts.length >= count,
        timeoutMs,
        () =>
          `${count} posts (have ${posts.length}: ${JSON.stringify(posts.map((post) => post.content.slice(0, 60)))})`,
      )
      return posts.slice(0, count)
    },
    waitForConnections(count, timeoutMs = 10_000) {
      return waitFor(
        () => sockets.size >= count,
        timeoutMs,
        () => `${count} connections (have ${sockets.size})`,
      )
    },
    waitForReadyCount(count, timeoutMs = 10_000) {
      return waitFor(
        () => readyCount >= count,
        timeoutMs,
        () => `${count} ready frames (sent ${readyCount})`,
      )
    },
    dropConnections() {
      for (const socket of sockets) socket.terminate()
    },
    refuseConnections(on) {
      refusing = on
    },
    sendRaw(frame) {
      for (const socket of sockets)
        if (socket.readyState === socket.OPEN) socket.send(typeof frame === 'string' ? frame : JSON.stringify(frame))
    },
    stopAnswering() {
      for (const socket of sockets) muted.add(socket)
    },
    ...platformFaults,
    limitUploads(bytes) {
      uploadLimit = bytes
    },
    uploads,
    close: () => closeFakeServer(server, {wss, sockets}),
  }
}
