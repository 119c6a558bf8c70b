import {SocketModeClient} from '@slack/socket-mode'
import {ErrorCode, LogLevel, WebClient, type Logger, type RetryOptions} from '@slack/web-api'
import type {InboundMessage} from '../shapes/agent-run-contract.js'
import {downloadFile, DownloadRefused, type AllowedOrigin} from '../http/download.js'
import type {IncomingFile} from './attachments.js'
import {DEFAULT_BACKOFF, type BackoffOptions} from './backoff.js'
import type {ConnectorAudience} from '../config/types.js'
import {listensTo} from './audience.js'
import {ReconnectingConnector} from './reconnecting-connector.js'
import {DeliveryError, retryableStatus} from './delivery-error.js'
import type {ConnectorContext, Conversation, ReplyPacing} from './types.js'
import type {OutboundFile} from '../shapes/outbound-file.js'

export const SLACK_MESSAGE_LIMIT = 4000

export interface SlackTimings {
  backoff: BackoffOptions
  /** Socket Mode's own ping/pong deadline (the library's default is 5 s). */
  clientPingTimeoutMs: number
  /** Web API retries for HTTP failures of the connector's own calls (auth.test, users.info), not of replies. */
  retryConfig: RetryOptions
  /** chat.postMessage allows about one message a second per channel, with short bursts. */
  pacing: ReplyPacing
}

export const DEFAULT_SLACK_TIMINGS: SlackTimings = {
  backoff: DEFAULT_BACKOFF,
  clientPingTimeoutMs: 5000,
  retryConfig: {retries: 3, factor: 2, minTimeout: 500, maxTimeout: 5000},
  pacing: {burst: 3, perSecond: 1},
}

/** Platform errors of chat.postMessage that a later attempt may get past. */
const RETRYABLE_SLACK_ERRORS = new Set([
  'ratelimited',
  'internal_error',
  'fatal_error',
  'service_unavailable',
  'request_timeout',
])

interface SlackMessageEvent {
  type: string
  subtype?: string
  bot_id?: string
  user?: string
  text?: string
  channel?: string
  /** `im` for a direct message. */
  channel_type?: string
  ts?: string
  thread_ts?: string
  files?: SlackFile[]
}

interface SlackFile {
  id?: string
  name?: string
  title?: string
  mimetype?: string
  size?: number
  url_private?: string
  url_private_download?: string
  /** `hosted`; `tombstone` (deleted), `hidden_by_limit` (free plan), `external` have no bytes here. */
  mode?: string
}

/** Where url_private points: Slack's file host, fetched with the bot token. */
const SLACK_FILE_ORIGIN = 'https://files.slack.com'

const MISSING_FILES_SCOPE =
  'the Slack app lacks the files:read scope, so the gateway cannot download it (add files:read under OAuth & Permissions and reinstall the app)'

/**
 * Text as Slack shows it, not as markup: `<!channel>` in a file name or in the agent's words would
 * notify the whole channel, `<@U1>` mention someone. No reply is meant as markup (the gateway's own
 * words use none), so &, < and > are escaped as Slack documents: like Discord's `allowed_mentions`,
 * the bot mentions no one. A part of 4000 characters stays under Slack's 40,000 however it grows.
 */
function slackPlainText(text: string): string {
  return text.replace(/&/g, '&amp;').replace(/</g, '&lt;').replace(/>/g, '&gt;')
}

/** The libraries log through this; connection problems are reported by the connector itself. */
const quietLogger: Logger = {
  debug: () => {},
  info: () => {},
  warn: () => {},
  error: () => {},
  setLevel: () => {},
  getLevel: () => LogLevel.ERROR,
  setName: () => {},
}

/**
 * Slack over Socket Mode (@slack/socket-mode) with replies through the Web API
 * (@slack/web-api): `auth.test` names the bot, `message` and `app_mention` events come in,
 * replies go in the message's thread. Reconnection is ours (the library's linear retry can end
 * in an unhandled rejection), with the same exponential backoff as every connector.
 */
export class SlackConnector extends ReconnectingConnector {
  readonly type = 'slack'
  readonly messageLimit = SLACK_MESSAGE_LIMIT
  readonly pacing: ReplyPacing
  private readonly web: WebClient
  /**
   * Replies go through a client that neither retries nor waits out a 429 (its default pauses
   * every call for the Retry-After): it says how long to wait, and the outbox waits for that reply only.
   */
  private readonly poster: WebClient
  private readonly userNames = new Map<string, string>()
  private inbound: Promise<void> = Promise.resolve()
  private socket: SocketModeClient | undefined
  private botUserId: string | undefined
  /** The bot token's scopes, as auth.test's x-oauth-scopes named them (undefined: Slack did not say). */
  private scopes: string[] | undefined
  private connecting = false

  constructor(
    private readonly config: {bot_token: string; app_token: string; api_url?: string} & ConnectorAudience,
    private readonly context: ConnectorContext,
    private readonly timings: SlackTimings = DEFAULT_SLACK_TIMINGS,
  ) {
    super(context, timings.backoff)
    this.web = new WebClient(config.bot_token, {
      ...this.apiUrlOption(),
      logger: quietLogger,
      retryConfig: timings.retryConfig,
      timeout: 15_000,
    })
    this.pacing = timings.pacing
    this.poster = new WebClient(config.bot_token, {
      ...this.apiUrlOption(),
      logger: quietLogger,
      retryConfig: {retries: 0},
      rejectRateLimitedCalls: true,
      timeout: 15_000,
    })
  }

  protected async disconnect(): Promise<void> {
    const socket = this.socket
    this.socket = undefined
    if (socket) {
      await Promise.race([
        socket.disconnect().catch(() => {}),
        new Promise((resolve) => setTimeout(resolve, 2000).unref()),
      ])
    }
  }

  private apiUrlOption(): {slackApiUrl?: string} {
    if (!this.config.api_url) return {}
    return {slackApiUrl: this.config.api_url.endsWith('/') ? this.config.api_url : `${this.config.api_url}/`}
  }

  protected async connect(): Promise<void> {
    if (this.stopped || this.connecting) return
    this.connecting = true
    this.status.connecting()
    try {
      const auth = await this.web.auth.test()
      this.botUserId = auth.user_id
      this.scopes = auth.response_metadata?.scopes
      if (this.scopes && !this.scopes.includes('files:read'))
        this.status.note(
          'the Slack app lacks the files:read scope: files users send cannot be downloaded (add files:read under OAuth & Permissions and reinstall the app)',
        )
      const socket = new SocketModeClient({
        appToken: this.config.app_token,
        logger: quietLogger,
        autoReconnectEnabled: false,
        clientPingTimeout: this.timings.clientPingTimeoutMs,
        clientOptions: {...this.apiUrlOption(), retryConfig: {retries: 0}, timeout: 15_000},
      })
      this.socket = socket
      socket.on('message', (args) => socket === this.socket && this.onEventSafely(args))
      socket.on('app_mention', (args) => socket === this.socket && this.onEventSafely(args))
      socket.on('disconnected', () => this.onDisconnected(socket, 'connection closed'))
      socket.on('error', () => {}) // followed by 'disconnected', which reconnects
      await socket.start()
      if (this.stopped || socket !== this.socket) return
      this.backoff.reset()
      this.status.connected(`as ${auth.user ?? auth.user_id ?? 'bot'} in ${auth.team ?? 'workspace'}`)
    } catch (error) {
      this.onDisconnected(this.socket, describeSlackError(error))
    } finally {
      this.connecting = false
    }
  }

  private onDisconnected(socket: SocketModeClient | undefined, why: string): void {
    if (this.stopped || socket !== this.socket || this.reconnectTimer) return
    this.socket = undefined
    // its listeners stay (the library's own close handling needs them); ours ignore a replaced socket
    if (socket) void socket.disconnect().catch(() => {})
    const delay = this.backoff.next()
    this.status.down(why, delay)
    this.reconnectTimer = setTimeout(() => {
      this.reconnectTimer = undefined
      void this.connect()
    }, delay)
  }

  private onEventSafely(args: {ack: () => Promise<void>; event: SlackMessageEvent}): void {
    try {
      this.onEvent(args)
    } catch (error) {
      // an event of an unexpected shape must not take the gateway down
      this.status.note(`ignored an event it could not handle: ${(error as Error).message}`)
    }
  }

  private onEvent(args: {ack: () => Promise<void>; event: SlackMessageEvent}): void {
    // Slack redelivers an event until it is acknowledged: one this gateway does not answer is
    // acknowledged at once, one it answers once it is recorded and handed to the agent
    const ack = () => void args.ack().catch(() => {})
    const event = args.event
    if (!event?.channel || !event.ts || !event.user) return ack()
    if (event.bot_id || event.user === this.botUserId) return ack() // its own replies and other bots: no loops
    // edits, joins, deletions
    if (event.subtype && event.subtype !== 'file_share' && event.subtype !== 'thread_broadcast') return ack()
    const files = (Array.isArray(event.files) ? event.files : []).map((file) => this.incomingFile(file))
    const text = typeof event.text === 'string' ? event.text : ''
    if (!text.trim() && files.length === 0) return ack()
    const place = {
      channelIds: [event.channel],
      isDm: event.channel_type === 'im',
      mentioned: event.type === 'app_mention' || text.includes(`<@${this.botUserId}>`),
    }
    if (!listensTo(this.config, place)) return ack()
    // an @mention arrives twice, as `message` and as `app_mention`: answer once
    const postedAt = Number(event.ts) * 1000
    if (!this.catchUp.admit(event.channel, event.ts, postedAt)) return ack()
    const threadTs = event.thread_ts ?? event.ts
    const message: InboundMessage = {
      id: event.ts,
      connector: 'slack',
      channel_id: event.channel,
      thread_id: threadTs,
      user: {id: event.user, name: event.user},
      content: text,
    }
    const channel = event.channel
    const userId = event.user
    // name lookups are chained so messages reach the queue in the order Slack sent them
    this.inbound = this.inbound.then(async () => {
      const name = await this.userName(userId)
      if (this.stopped) return // unacknowledged: Slack delivers it again to the next connection
      if (this.catchUp.claim(channel, message.id, postedAt))
        this.dispatch({...message, user: {id: userId, name}}, channel, threadTs, files)
      ack()
    })
  }

  private dispatch(message: InboundMessage, channel: string, threadTs: string, files: IncomingFile[]): void {
    // bots have no typing indicator over Socket Mode
    this.context.onMessage(
      message,
      this.delivery(channel, threadTs, () => () => {}),
      files,
    )
  }

  /** url_private on Slack's file host (or the configured api_url's, for tests) with the bot token, nothing else. */
  private incomingFile(file: SlackFile): IncomingFile {
    const headers = {Authorization: `Bearer ${this.config.bot_token}`}
    const allowed: AllowedOrigin[] = [
      {origin: SLACK_FILE_ORIGIN, publicOnly: true, headers},
      ...(this.config.api_url ? [{origin: new URL(this.config.api_url).origin, publicOnly: false, headers}] : []),
    ]
    const url = file?.url_private_download ?? file?.url_private
    const contentType = typeof file?.mimetype === 'string' ? file.mimetype : undefined
    const unavailable =
      this.scopes && !this.scopes.includes('files:read')
        ? MISSING_FILES_SCOPE
        : file?.mode && file.mode !== 'hosted' && file.mode !== 'snippet' && file.mode !== 'post'
          ? `Slack holds no content for it (mode ${file.mode})`
          : typeof url !== 'string'
            ? 'Slack gave no url_private for it'
            : undefined
    return {
      name: file?.name || file?.title || file?.id || 'file',
      ...(contentType ? {contentType} : {}),
      ...(typeof file?.size === 'number' && file.size >= 0 ? {declaredSize: file.size} : {}),
      ...(unavailable ? {unavailable} : {}),
      read: ({maxBytes, signal}) =>
        downloadFile(url as string, {
          allowed,
          maxBytes,
          signal,
          // without files:read Slack answers url_private with its sign-in page, not an error
          onResponse: (response) => {
            const type = String(response['content-type'] ?? '')
            if (type.startsWith('text/html') && !contentType?.startsWith('text/html')) {
              this.status.note(`a file download got Slack's sign-in page: ${MISSING_FILES_SCOPE}`)
              throw new DownloadRefused('http', MISSING_FILES_SCOPE)
            }
          },
        }),
    }
  }

  async postMessage({channelId, threadId}: Omit<Conversation, 'connector'>, text: string): Promise<void> {
    try {
      await this.poster.chat.postMessage({
        channel: channelId,
        text: slackPlainText(text),
        ...(threadId ? {thread_ts: threadId} : {}),
      })
    } catch (error) {
      throw describePostError(error)
    }
  }

  /**
   * One file shared into the conversation (its thread when given) with the Web API's external
   * upload (files.getUploadURLExternal, the bytes to the URL it returns,
   * files.completeUploadExternal), through the client that neither retries nor waits: the outbox does.
   */
  async postFile({channelId, threadId}: Omit<Conversation, 'connector'>, file: OutboundFile): Promise<void> {
    const upload = {file: file.data, filename: file.name, title: file.name}
    try {
      await this.poster.filesUploadV2(
        threadId ? {...upload, channel_id: channelId, thread_ts: threadId} : {...upload, channel_id: channelId},
      )
    } catch (error) {
      throw describeUploadError(error)
    }
  }

  /** The sender's display name via users.info, cached; the id when Slack will not say. */
  private async userName(userId: string): Promise<string> {
    const cached = this.userNames.get(userId)
    if (cached) return cached
    let name = userId
    try {
      const info = await this.web.users.info({user: userId})
      name = info.user?.profile?.display_name || info.user?.real_name || info.user?.name || userId
    } catch {
      // users:read scope missing or a hiccup: the id still identifies the sender
    }
    if (this.userNames.size > 5000) this.userNames.clear()
    this.userNames.set(userId, name)
    return name
  }
}

/** Why Slack did not take a file, naming the scope the app lacks when that is it. */
function describeUploadError(error: unknown): DeliveryError {
  const data = (error as {data?: {error?: string; needed?: string}}).data
  if (data?.error === 'missing_scope')
    return new DeliveryError(
      `Slack refused it: the app lacks the ${data.needed ?? 'files:write'} scope (add it to the Slack app and reinstall it)`,
      false,
    )
  const failure = describePostError(error)
  return failure.retry ? failure : new DeliveryError(`Slack refused it: ${failure.message}`, false)
}

function describeSlackError(error: unknown): string {
  // the Socket Mode client rejects with nothing when its WebSocket fails before it opens
  if (!error || typeof error !== 'object') return 'the Socket Mode connection failed before it opened'
  const data = (error as {data?: {error?: string}}).data
  if (data?.error === 'invalid_auth' || data?.error === 'not_authed')
    return `Slack refused the token (${data.error}); check bot_token and app_token`
  if (data?.error) return `Slack answered ${data.error}`
  const {code, original} = error as {code?: string; original?: {cause?: {code?: string}; message?: string}}
  if (code === 'slack_webapi_request_error')
    return `cannot reach the Slack API: ${original?.cause?.code ?? original?.message ?? 'request failed'}`
  if (code === 'slack_webapi_http_error')
    return `the Slack API answered ${(error as {statusCode?: number}).statusCode ?? 'an HTTP error'}`
  return (error as Error).message ?? String(error)
}

/** A failed chat.postMessage as the outbox sees it: wait and retry, or give up with Slack's reason. */
function describePostError(error: unknown): DeliveryError {
  const {code} = error as {code?: string}
  if (code === ErrorCode.RateLimitedError)
    return new DeliveryError('Slack rate-limited the post', true, (error as {retryAfter: number}).retryAfter * 1000)
  if (code === ErrorCode.HTTPError) {
    const status = (error as {statusCode?: number}).statusCode ?? 0
    return new DeliveryError(`the Slack API answered HTTP ${status}`, retryableStatus(status))
  }
  const platformError = (error as {data?: {error?: string}}).data?.error
  if (code === ErrorCode.PlatformError && platformError)
    return new DeliveryError(`Slack answered ${platformError}`, RETRYABLE_SLACK_ERRORS.has(platformError))
  return new DeliveryError(describeSlackError(error), true)
}
