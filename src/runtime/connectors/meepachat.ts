import WebSocket from 'ws'
import type {InboundMessage} from '../shapes/agent-run-contract.js'
import {DEFAULT_BACKOFF, formatDelay, type BackoffOptions} from './backoff.js'
import {ReconnectingConnector} from './reconnecting-connector.js'
import {splitMessage} from './split-message.js'
import {keepTyping} from './typing.js'
import type {ConnectorContext, Delivery} from './types.js'
import {refusalNote, type FileRefusal, type OutboundFile} from '../shapes/outbound-file.js'

export const MEEPACHAT_MESSAGE_LIMIT = 4000

export interface MeepaChatTimings {
  /** Application-level `{type: "ping"}` interval; the connection is presumed dead after two silent intervals. */
  pingIntervalMs: number
  backoff: BackoffOptions
  typingIntervalMs: number
  /** Limit for the socket to open and for each REST call. */
  requestTimeoutMs: number
}

export const DEFAULT_MEEPACHAT_TIMINGS: MeepaChatTimings = {
  pingIntervalMs: 30_000,
  backoff: DEFAULT_BACKOFF,
  typingIntervalMs: 5_000,
  requestTimeoutMs: 15_000,
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
  user?: MeepaUser
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
 * MeepaChat bot gateway: a WebSocket with `Authorization: Bot <token>` carrying `{type, data}`
 * frames, replies over REST. Reconnects with exponential backoff for as long as it runs.
 */
export class MeepaChatConnector extends ReconnectingConnector {
  readonly type = 'meepachat'
  private readonly channels = new Map<string, ChannelInfo>()
  private readonly restBase: string
  /** The gateway URL without query or credentials (an old-style `?token=` must not reach the log). */
  private readonly displayUrl: string
  private socket: WebSocket | undefined
  private botUserId: string | undefined
  private pingTimer: NodeJS.Timeout | undefined
  private lastFrameAt = 0

  constructor(
    private readonly config: {url: string; bot_token: string},
    private readonly context: ConnectorContext,
    private readonly timings: MeepaChatTimings = DEFAULT_MEEPACHAT_TIMINGS,
  ) {
    super(context, timings.backoff)
    this.restBase = meepaChatRestBase(config.url)
    const url = new URL(config.url)
    this.displayUrl = `${url.protocol}//${url.host}${url.pathname}`
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
    this.status.set('connecting', this.displayUrl)
    const socket = new WebSocket(this.config.url, {
      headers: {Authorization: `Bot ${this.config.bot_token}`},
      handshakeTimeout: this.timings.requestTimeoutMs,
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
      this.status.set('disconnected', `${why}; reconnecting in ${formatDelay(delay)}`)
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
    const servers = data?.servers ?? []
    for (const server of servers) {
      for (const channel of server.channels ?? [])
        this.rememberChannel({...channel, serverId: channel.serverId ?? server.id})
    }
    for (const channel of data?.dmChannels ?? []) this.rememberChannel({...channel, isDm: true})
    this.backoff.reset()
    const who = data?.user?.username ?? this.botUserId ?? 'unknown bot'
    this.status.set(
      'connected',
      `as ${who}, ${servers.length} server(s), ${data?.dmChannels?.length ?? 0} DM channel(s)`,
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
    if (typeof data.content !== 'string' || !data.content.trim()) return
    if (!this.seen.firstSeen(data.id)) return
    const message: InboundMessage = {
      id: data.id,
      connector: 'meepachat',
      channel_id: channelId,
      ...(data.threadId ? {thread_id: data.threadId} : {}),
      user: {id: userId, name: data.user?.displayName || data.user?.username || userId},
      content: data.content,
    }
    this.context.onMessage(message, this.deliveryTo(channelId, data.threadId ?? undefined))
  }

  deliveryTo(channelId: string, threadId?: string): Delivery {
    return {
      send: async (text) => {
        for (const chunk of splitMessage(text, MEEPACHAT_MESSAGE_LIMIT))
          await this.postMessage(channelId, chunk, threadId)
      },
      sendWithFiles: (text, files) => this.sendWithFiles(channelId, threadId, text, files),
      startTyping: () =>
        keepTyping(() => this.sendFrame({type: 'typing', data: {channelId}}), this.timings.typingIntervalMs),
    }
  }

  private messagesPath(channelId: string): string {
    const channel = this.channels.get(channelId)
    // a channel the ready frame did not list is a DM opened since (clients use the dm- prefix the same way)
    if (!channel || channel.isDm || !channel.serverId) return `/api/dms/${encodeURIComponent(channelId)}/messages`
    return `/api/servers/${encodeURIComponent(channel.serverId)}/channels/${encodeURIComponent(channelId)}/messages`
  }

  /**
   * Posts one message; `attachmentIds` are uploads made by uploadAttachment (they become the
   * message's attachments, as the authors' clients send them).
   */
  async postMessage(
    channelId: string,
    content: string,
    threadId: string | undefined,
    attachmentIds: string[] = [],
  ): Promise<void> {
    const body = JSON.stringify({
      content,
      ...(threadId ? {threadId} : {}),
      ...(attachmentIds.length > 0 ? {attachmentIds} : {}),
    })
    await this.request('POST', this.messagesPath(channelId), body)
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
      throw new Error('MeepaChat answered the presign request without an uploadId')
    const form = new FormData()
    form.append('file', new Blob([file.data as Uint8Array<ArrayBuffer>], {type: file.content_type}), file.name)
    await this.request('PUT', `/api/attachments/upload/${encodeURIComponent(uploadId)}`, form)
    return uploadId
  }

  /**
   * Files first (each upload on its own: one refused does not stop the others), then the text with
   * the uploaded ones attached to its last part and a note naming those refused.
   */
  private async sendWithFiles(
    channelId: string,
    threadId: string | undefined,
    text: string,
    files: OutboundFile[],
  ): Promise<FileRefusal[]> {
    const uploaded: Array<{file: OutboundFile; id: string}> = []
    const refused: FileRefusal[] = []
    for (const file of files) {
      try {
        uploaded.push({file, id: await this.uploadAttachment(file)})
      } catch (error) {
        refused.push({name: file.name, reason: (error as Error).message})
      }
    }
    const chunks = splitMessage(text + refusalNote(refused), MEEPACHAT_MESSAGE_LIMIT)
    for (const chunk of chunks.slice(0, -1)) await this.postMessage(channelId, chunk, threadId)
    const last = chunks.at(-1) ?? ''
    if (uploaded.length === 0) {
      await this.postMessage(channelId, last, threadId)
      return refused
    }
    try {
      await this.postMessage(
        channelId,
        last,
        threadId,
        uploaded.map(({id}) => id),
      )
      return refused
    } catch (error) {
      if (!(error instanceof MeepaChatHttpError)) throw error
      // the server took the uploads but not the message with them: the text still goes out
      const notAttached = uploaded.map(({file}) => ({name: file.name, reason: error.message}))
      await this.postMessage(channelId, last + refusalNote(notAttached), threadId)
      return [...refused, ...notAttached]
    }
  }

  /** One REST call with the bot token, retried on network errors, 429 and 5xx; the parsed JSON answer. */
  private async request(method: string, path: string, body: string | FormData): Promise<unknown> {
    const url = this.restBase + path
    const headers: Record<string, string> = {Authorization: `Bot ${this.config.bot_token}`}
    if (typeof body === 'string') headers['Content-Type'] = 'application/json'
    for (let attempt = 1; ; attempt++) {
      let response: Response
      try {
        response = await fetch(url, {method, headers, body, signal: AbortSignal.timeout(this.timings.requestTimeoutMs)})
      } catch (error) {
        if (attempt >= 3)
          throw new Error(`cannot reach MeepaChat at ${new URL(url).origin}: ${(error as Error).message}`, {
            cause: error,
          })
        await new Promise((resolve) => setTimeout(resolve, 500 * attempt))
        continue
      }
      const text = await response.text()
      if (response.ok) {
        try {
          return text ? JSON.parse(text) : undefined
        } catch {
          return undefined
        }
      }
      const retryable = response.status === 429 || response.status >= 500
      if (retryable && attempt < 3) {
        const retryAfter = Number(response.headers.get('retry-after'))
        await new Promise((resolve) =>
          setTimeout(
            resolve,
            Number.isFinite(retryAfter) && retryAfter > 0 ? Math.min(retryAfter, 10) * 1000 : 500 * attempt,
          ),
        )
        continue
      }
      let detail = text.slice(0, 200)
      try {
        detail = (JSON.parse(text) as {error?: string}).error ?? detail
      } catch {
        // not JSON: keep the raw text
      }
      throw new MeepaChatHttpError(
        response.status,
        `MeepaChat answered HTTP ${response.status} to ${method} ${new URL(url).pathname}: ${detail}`,
      )
    }
  }
}

/** The server answered, and said no: a refusal, not a connection problem. */
class MeepaChatHttpError extends Error {
  constructor(
    readonly status: number,
    message: string,
  ) {
    super(message)
  }
}
