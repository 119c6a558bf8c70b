import https from 'node:https'
import WebSocket from 'ws'
import {httpFetch} from '../providers/http-fetch.js'
import type {InboundMessage} from '../shapes/agent-run-contract.js'
import {downloadFile, type AllowedOrigin} from '../http/download.js'
import type {IncomingFile} from './attachments.js'
import {DEFAULT_BACKOFF, type BackoffOptions} from './backoff.js'
import type {ConnectorAudience} from '../config/types.js'
import {listensTo} from './audience.js'
import {ReconnectingConnector} from './reconnecting-connector.js'
import {DeliveryError, retryAfterMs, retryableStatus} from './delivery-error.js'
import {keepTyping} from './typing.js'
import type {ConnectorContext, Conversation, ReplyPacing} from './types.js'
import type {OutboundFile} from '../shapes/outbound-file.js'

export const MEEPACHAT_MESSAGE_LIMIT = 4000

export interface MeepaChatTimings {
  /** Application-level `{type: "ping"}` interval; the connection is presumed dead after two silent intervals. */
  pingIntervalMs: number
  backoff: BackoffOptions
  typingIntervalMs: number
  /** Limit for the socket to open and for each REST call. */
  requestTimeoutMs: number
  /** The bot API allows 240 requests a minute. */
  pacing: ReplyPacing
}

export const DEFAULT_MEEPACHAT_TIMINGS: MeepaChatTimings = {
  pingIntervalMs: 30_000,
  backoff: DEFAULT_BACKOFF,
  typingIntervalMs: 5_000,
  requestTimeoutMs: 15_000,
  pacing: {burst: 4, perSecond: 4},
}

interface ChannelInfo {
  serverId: string | null
  isDm: boolean
}

interface MeepaUser {
  id: string
  username?: string
  displayName?: string
  bot?: boolean
}

interface MeepaChannel {
  id: string
  serverId?: string | null
  isDm?: boolean
}

interface MeepaMessage {
  id: string
  channelId?: string
  channel_id?: string
  userId?: string
  user_id?: string
  threadId?: string | null
  content?: string
  createdAt?: string
  user?: MeepaUser
  mentions?: Array<{id?: string}>
  attachments?: MeepaAttachment[]
}

/** As the authors' bot clients read it: fetched from `<server>/<storedPath>` with the bot token. */
interface MeepaAttachment {
  id?: string
  filename?: string
  storedPath?: string
  mimeType?: string
  sizeBytes?: number
}

/** `wss://host/prefix/api/bot-gateway` → `https://host/prefix`: where the REST API lives. */
export function meepaChatRestBase(gatewayUrl: string): string {
  const url = new URL(gatewayUrl)
  url.protocol = url.protocol === 'wss:' ? 'https:' : 'http:'
  url.pathname = url.pathname.replace(/\/api\/bot-gateway\/?$/, '').replace(/\/$/, '')
  url.search = ''
  return url.toString().replace(/\/$/, '')
}

/**
 * Where an attachment is fetched with the bot token: `<server>/<storedPath>`, as the authors'
 * clients do. The sender writes storedPath, so it must name a stored file and nothing else the
 * token reaches: not the REST API under `/api`, no query or fragment, and no percent-encoded dot or
 * slash (a server that decodes them after routing would walk elsewhere). Checked on the resolved URL.
 */
export function meepaChatAttachmentUrl(restBase: string, storedPath: string): {url: string} | {problem: string} {
  const base = new URL(`${restBase}/`)
  let url: URL | undefined
  try {
    url = new URL(storedPath.replace(/^\/+/, ''), base)
  } catch {
    // not a path: refused below
  }
  const relative =
    url?.origin === base.origin && url.pathname.startsWith(base.pathname)
      ? url.pathname.slice(base.pathname.length)
      : ''
  if (!url || !relative) return {problem: 'its storedPath is not a path on the MeepaChat server'}
  if (url.href !== url.origin + url.pathname)
    return {problem: 'its storedPath carries a query or fragment, which no stored file has'}
  // `api`, `api/…`, and `api;…`, which some servers route as `api`
  if (/^api(?![\w-])/i.test(relative)) return {problem: "its storedPath names MeepaChat's REST API, not a stored file"}
  if (/%(2e|2f|5c)/i.test(url.pathname)) return {problem: 'its storedPath holds a percent-encoded dot or slash'}
  return {url: url.href}
}

/**
 * MeepaChat bot gateway: a WebSocket with `Authorization: Bot <token>` carrying `{type, data}`
 * frames, replies over REST. Reconnects with exponential backoff for as long as it runs.
 */
export class MeepaChatConnector extends ReconnectingConnector {
  readonly type = 'meepachat'
  readonly messageLimit = MEEPACHAT_MESSAGE_LIMIT
  private readonly channels = new Map<string, ChannelInfo>()
  private readonly restBase: string
  /** The gateway URL without query or credentials (an old-style `?token=` must not reach the log). */
  private readonly displayUrl: string
  private socket: WebSocket | undefined
  private botUserId: string | undefined
  /** `@username` and `@displayName` of the bot: how its authors' clients recognise a mention in the text. */
  private botHandles: string[] = []
  private pingTimer: NodeJS.Timeout | undefined
  private lastFrameAt = 0
  /** tls_verify: false (a server with a self-signed certificate): the socket and REST calls accept any certificate. */
  private readonly verifyTls: boolean
  private readonly fetchRest: typeof fetch
  readonly pacing: ReplyPacing

  constructor(
    private readonly config: {url: string; bot_token: string; tls_verify?: boolean} & ConnectorAudience,
    private readonly context: ConnectorContext,
    private readonly timings: MeepaChatTimings = DEFAULT_MEEPACHAT_TIMINGS,
  ) {
    super(context, timings.backoff)
    this.pacing = timings.pacing
    this.restBase = meepaChatRestBase(config.url)
    const url = new URL(config.url)
    this.displayUrl = `${url.protocol}//${url.host}${url.pathname}`
    this.verifyTls = config.tls_verify !== false
    const insecure = this.verifyTls ? undefined : new https.Agent({rejectUnauthorized: false, keepAlive: true})
    this.fetchRest = insecure ? (input, init) => httpFetch(input as string, {...init, agent: insecure}) : fetch
  }

  protected async disconnect(): Promise<void> {
    this.stopPing()
    const socket = this.socket
    this.socket = undefined
    if (socket && socket.readyState !== WebSocket.CLOSED) {
      await new Promise<void>((resolve) => {
        const force = setTimeout(() => {
          socket.terminate()
          resolve()
        }, 2000)
        socket.once('close', () => {
          clearTimeout(force)
          resolve()
        })
        socket.close(1000, 'gateway stopping')
      })
    }
  }

  protected connect(): void {
    if (this.stopped) return
    this.status.connecting(this.displayUrl)
    const socket = new WebSocket(this.config.url, {
      headers: {Authorization: `Bot ${this.config.bot_token}`},
      handshakeTimeout: this.timings.requestTimeoutMs,
      rejectUnauthorized: this.verifyTls,
    })
    this.socket = socket
    let failure: string | undefined

    socket.on('unexpected-response', (_request, response) => {
      failure =
        response.statusCode === 401 || response.statusCode === 403
          ? `the server refused the bot token (HTTP ${response.statusCode}); check bot_token`
          : `the server answered HTTP ${response.statusCode} instead of a WebSocket`
      response.resume()
      socket.terminate()
    })
    socket.on('error', (error) => {
      failure ??= error.message || String(error)
    })
    socket.on('open', () => {
      this.lastFrameAt = Date.now()
      this.startPing(socket)
    })
    socket.on('ping', () => (this.lastFrameAt = Date.now())) // the server's own keep-alive counts as a sign of life
    socket.on('message', (data) => {
      this.lastFrameAt = Date.now()
      try {
        this.onFrame(String(data))
      } catch (error) {
        // a frame of an unexpected shape must not take the gateway down
        this.status.note(`ignored a frame it could not handle: ${(error as Error).message}`)
      }
    })
    socket.on('close', (code, reason) => {
      if (socket !== this.socket) return // an old socket, already replaced
      this.stopPing()
      this.socket = undefined
      if (this.stopped) return
      const why = failure ?? `connection closed (code ${code}${reason.length ? `, ${reason.toString()}` : ''})`
      const delay = this.backoff.next()
      this.status.down(why, delay)
      this.reconnectTimer = setTimeout(() => this.connect(), delay)
    })
  }

  private startPing(socket: WebSocket): void {
    this.stopPing()
    this.pingTimer = setInterval(() => {
      if (Date.now() - this.lastFrameAt > 2 * this.timings.pingIntervalMs) {
        socket.terminate() // no pong, no events: the connection is dead even if TCP has not noticed
        return
      }
      this.sendFrame({type: 'ping'})
    }, this.timings.pingIntervalMs)
    this.pingTimer.unref()
  }

  private stopPing(): void {
    clearInterval(this.pingTimer)
    this.pingTimer = undefined
  }

  private sendFrame(frame: {type: string; data?: unknown}): void {
    if (this.socket?.readyState === WebSocket.OPEN) this.socket.send(JSON.stringify(frame))
  }

  private onFrame(text: string): void {
    let frame: {type?: unknown; data?: unknown}
    try {
      frame = JSON.parse(text)
    } catch {
      return // not ours to interpret; the server may add frame kinds
    }
    switch (frame.type) {
      case 'ready':
        this.onReady(
          frame.data as {
            user?: MeepaUser
            servers?: Array<{id: string; channels?: MeepaChannel[]}>
            dmChannels?: MeepaChannel[]
          },
        )
        break
      case 'message.created':
        this.onMessage(frame.data as MeepaMessage)
        break
      case 'channel.created':
      case 'channel.updated':
        this.rememberChannel(frame.data as MeepaChannel)
        break
      case 'server.added': {
        const server = frame.data as {id: string; channels?: MeepaChannel[]}
        for (const channel of server?.channels ?? [])
          this.rememberChannel({...channel, serverId: channel.serverId ?? server.id})
        break
      }
      default:
        break
    }
  }

  private onReady(data: {
    user?: MeepaUser
    servers?: Array<{id: string; channels?: MeepaChannel[]}>
    dmChannels?: MeepaChannel[]
  }): void {
    this.botUserId = data?.user?.id
    this.botHandles = [data?.user?.username, data?.user?.displayName].filter(Boolean).map((name) => `@${name}`)
    const servers = data?.servers ?? []
    for (const server of servers) {
      for (const channel of server.channels ?? [])
        this.rememberChannel({...channel, serverId: channel.serverId ?? server.id})
    }
    for (const channel of data?.dmChannels ?? []) this.rememberChannel({...channel, isDm: true})
    this.backoff.reset()
    const downSince = this.status.downSinceTime
    const who = data?.user?.username ?? this.botUserId ?? 'unknown bot'
    this.status.connected(`as ${who}, ${servers.length} server(s), ${data?.dmChannels?.length ?? 0} DM channel(s)`)
    if (downSince !== undefined)
      this.status.note(
        `messages sent to it while it was disconnected (since ${new Date(downSince).toISOString()}) go unanswered: ` +
          `the MeepaChat bot gateway does not replay them and its bot API cannot read a channel's messages`,
      )
  }

  private rememberChannel(channel: MeepaChannel): void {
    if (!channel?.id) return
    const isDm = Boolean(channel.isDm) || !channel.serverId
    this.channels.set(channel.id, {serverId: isDm ? null : (channel.serverId as string), isDm})
  }

  private onMessage(data: MeepaMessage): void {
    if (!data?.id) return
    const channelId = data.channelId ?? data.channel_id
    const userId = data.userId ?? data.user_id ?? data.user?.id
    if (!channelId || !userId) return
    if (userId === this.botUserId || data.user?.bot) return // its own replies and other bots: no loops
    const files = (Array.isArray(data.attachments) ? data.attachments : []).map((attachment) =>
      this.incomingFile(attachment),
    )
    const content = typeof data.content === 'string' ? data.content : ''
    if (!content.trim() && files.length === 0) return
    const channel = this.channels.get(channelId)
    const place = {
      channelIds: [channelId],
      isDm: channel ? channel.isDm : channelId.startsWith('dm-'),
      mentioned:
        Boolean(data.mentions?.some((mention) => mention.id === this.botUserId)) ||
        this.botHandles.some((handle) => content.includes(handle)),
    }
    if (!listensTo(this.config, place)) return
    const postedAt = Date.parse(data.createdAt ?? '') || Date.now()
    if (!this.catchUp.admit(channelId, data.id, postedAt)) return
    if (!this.catchUp.claim(channelId, data.id, postedAt)) return
    const message: InboundMessage = {
      id: data.id,
      connector: 'meepachat',
      channel_id: channelId,
      ...(data.threadId ? {thread_id: data.threadId} : {}),
      user: {id: userId, name: data.user?.displayName || data.user?.username || userId},
      content,
    }
    const typing = () =>
      keepTyping(() => this.sendFrame({type: 'typing', data: {channelId}}), this.timings.typingIntervalMs)
    this.context.onMessage(message, this.delivery(channelId, data.threadId ?? undefined, typing), files)
  }

  /** Only this server, with the bot token: the URL is built from `storedPath`, never taken whole. */
  private incomingFile(attachment: MeepaAttachment): IncomingFile {
    const storedPath = typeof attachment?.storedPath === 'string' ? attachment.storedPath : ''
    const found = meepaChatAttachmentUrl(this.restBase, storedPath)
    const allowed: AllowedOrigin[] = [
      {
        origin: new URL(this.restBase).origin,
        publicOnly: false,
        headers: {Authorization: `Bot ${this.config.bot_token}`},
        verifyTls: this.verifyTls,
      },
    ]
    const size = attachment?.sizeBytes
    return {
      name: typeof attachment?.filename === 'string' ? attachment.filename : 'file',
      ...(typeof attachment?.mimeType === 'string' ? {contentType: attachment.mimeType} : {}),
      ...(typeof size === 'number' && Number.isFinite(size) && size >= 0 ? {declaredSize: size} : {}),
      ...('problem' in found ? {unavailable: found.problem} : {}),
      read: ({maxBytes, signal}) =>
        downloadFile('url' in found ? found.url : '', {
          allowed,
          maxBytes,
          signal,
          idleTimeoutMs: this.timings.requestTimeoutMs,
        }),
    }
  }

  private messagesPath(channelId: string): string {
    const channel = this.channels.get(channelId)
    // a channel the ready frame did not list is a DM opened since (clients use the dm- prefix the same way)
    if (!channel || channel.isDm || !channel.serverId) return `/api/dms/${encodeURIComponent(channelId)}/messages`
    return `/api/servers/${encodeURIComponent(channel.serverId)}/channels/${encodeURIComponent(channelId)}/messages`
  }

  /** One attempt; `attachmentIds` are uploads made by uploadAttachment (the message's attachments). */
  async postMessage(
    {channelId, threadId}: Omit<Conversation, 'connector'>,
    content: string,
    attachmentIds: string[] = [],
  ): Promise<void> {
    // a channel's server (and so its URL) is learned from the ready frame: a reply resumed at start waits for it
    if (!this.channels.has(channelId) && this.state !== 'connected')
      throw new DeliveryError(`not connected to MeepaChat yet (${this.problem ?? this.state})`, true)
    await this.request(
      'POST',
      this.messagesPath(channelId),
      JSON.stringify({
        content,
        ...(threadId ? {threadId} : {}),
        ...(attachmentIds.length > 0 ? {attachmentIds} : {}),
      }),
    )
  }

  /**
   * Uploads one file as the authors' clients do: presign `{filename, mimeType}`, then a multipart
   * PUT of field `file`. Returns the upload id to attach to a message. The upload always goes to
   * this server's own REST base: a presigned URL naming another host would get the bot token.
   */
  async uploadAttachment(file: OutboundFile): Promise<string> {
    const presigned = (await this.request(
      'POST',
      '/api/attachments/presign',
      JSON.stringify({filename: file.name, mimeType: file.content_type}),
    )) as {data?: {uploadId?: unknown}}
    const uploadId = presigned?.data?.uploadId
    if (typeof uploadId !== 'string' || !uploadId)
      throw new DeliveryError('MeepaChat answered the presign request without an uploadId', false)
    const form = new FormData()
    form.append('file', new Blob([file.data as Uint8Array<ArrayBuffer>], {type: file.content_type}), file.name)
    await this.request('PUT', `/api/attachments/upload/${encodeURIComponent(uploadId)}`, form)
    return uploadId
  }

  /**
   * One file as a message of its own: uploaded, then posted with its `attachmentIds` and its name
   * as the text (MeepaChat requires a message's content). A retry uploads it again.
   */
  async postFile(conversation: Omit<Conversation, 'connector'>, file: OutboundFile): Promise<void> {
    if (!this.channels.has(conversation.channelId) && this.state !== 'connected')
      throw new DeliveryError(`not connected to MeepaChat yet (${this.problem ?? this.state})`, true)
    await this.postMessage(conversation, file.name, [await this.uploadAttachment(file)])
  }

  /**
   * One REST call with the bot token; the parsed JSON answer. A failure is a DeliveryError that
   * says whether to try again (the outbox does, after the server's Retry-After).
   */
  private async request(method: string, path: string, body: string | FormData): Promise<unknown> {
    const url = this.restBase + path
    const headers: Record<string, string> = {Authorization: `Bot ${this.config.bot_token}`}
    if (typeof body === 'string') headers['Content-Type'] = 'application/json'
    let response: Response
    try {
      response = await this.fetchRest(url, {
        method,
        headers,
        body,
        signal: AbortSignal.timeout(this.timings.requestTimeoutMs),
      })
    } catch (error) {
      const cause = (error as {cause?: {code?: string}}).cause?.code ?? (error as Error).message
      throw new DeliveryError(`cannot reach MeepaChat at ${new URL(url).origin}: ${cause}`, true)
    }
    const text = await response.text().catch(() => '')
    if (response.ok) {
      try {
        return text ? JSON.parse(text) : undefined
      } catch {
        return undefined
      }
    }
    let detail = text.slice(0, 200)
    try {
      detail = (JSON.parse(text) as {error?: string}).error ?? detail
    } catch {
      // not JSON: keep the raw text
    }
    throw new DeliveryError(
      `MeepaChat answered HTTP ${response.status} to ${method} ${new URL(url).pathname}: ${detail}`,
      retryableStatus(response.status),
      retryAfterMs(response.headers.get('retry-after')),
    )
  }
}
