import {SocketModeClient} from '@slack/socket-mode'
import {LogLevel, WebClient, type Logger, type RetryOptions} from '@slack/web-api'
import type {InboundMessage} from '../shapes/agent-run-contract.js'
import {DEFAULT_BACKOFF, formatDelay, type BackoffOptions} from './backoff.js'
import {ReconnectingConnector} from './reconnecting-connector.js'
import {splitMessage} from './split-message.js'
import type {ConnectorContext, Delivery} from './types.js'
import {refusalNote, type FileRefusal, type OutboundFile} from '../shapes/outbound-file.js'

export const SLACK_MESSAGE_LIMIT = 4000

export interface SlackTimings {
  backoff: BackoffOptions
  /** Socket Mode's own ping/pong deadline (the library's default is 5 s). */
  clientPingTimeoutMs: number
  /** Web API retries for HTTP failures of one call (chat.postMessage); rate limits are always honoured. */
  retryConfig: RetryOptions
}

export const DEFAULT_SLACK_TIMINGS: SlackTimings = {
  backoff: DEFAULT_BACKOFF,
  clientPingTimeoutMs: 5000,
  retryConfig: {retries: 3, factor: 2, minTimeout: 500, maxTimeout: 5000},
}

interface SlackMessageEvent {
  type: string
  subtype?: string
  bot_id?: string
  user?: string
  text?: string
  channel?: string
  ts?: string
  thread_ts?: string
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
  private readonly web: WebClient
  private readonly userNames = new Map<string, string>()
  private inbound: Promise<void> = Promise.resolve()
  private socket: SocketModeClient | undefined
  private botUserId: string | undefined
  private connecting = false

  constructor(
    private readonly config: {bot_token: string; app_token: string; api_url?: string},
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
    this.status.set('connecting')
    try {
      const auth = await this.web.auth.test()
      this.botUserId = auth.user_id
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
      this.status.set('connected', `as ${auth.user ?? auth.user_id ?? 'bot'} in ${auth.team ?? 'workspace'}`)
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
    this.status.set('disconnected', `${why}; reconnecting in ${formatDelay(delay)}`)
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
    // Slack redelivers an event that is not acknowledged within 3 s: acknowledge first
    void args.ack().catch(() => {})
    const event = args.event
    if (!event?.channel || !event.ts || !event.user) return
    if (event.bot_id || event.user === this.botUserId) return // its own replies and other bots: no loops
    // edits, joins, deletions
    if (event.subtype && event.subtype !== 'file_share' && event.subtype !== 'thread_broadcast') return
    if (typeof event.text !== 'string' || !event.text.trim()) return
    // an @mention arrives twice, as `message` and as `app_mention`: answer once
    if (!this.seen.firstSeen(`${event.channel}:${event.ts}`)) return
    const threadTs = event.thread_ts ?? event.ts
    const message: InboundMessage = {
      id: event.ts,
      connector: 'slack',
      channel_id: event.channel,
      thread_id: threadTs,
      user: {id: event.user, name: event.user},
      content: event.text,
    }
    const channel = event.channel
    const userId = event.user
    // name lookups are chained so messages reach the queue in the order Slack sent them
    this.inbound = this.inbound.then(async () => {
      const name = await this.userName(userId)
      if (!this.stopped) this.dispatch({...message, user: {id: userId, name}}, channel, threadTs)
    })
  }

  private dispatch(message: InboundMessage, channel: string, threadTs: string): void {
    this.context.onMessage(message, this.deliveryTo(channel, threadTs))
  }

  deliveryTo(channel: string, threadTs?: string): Delivery {
    return {
      send: async (text) => {
        for (const chunk of splitMessage(text, SLACK_MESSAGE_LIMIT)) {
          await this.web.chat.postMessage({channel, text: chunk, ...(threadTs ? {thread_ts: threadTs} : {})})
        }
      },
      // files first, each shared into the conversation by its own upload, then the text with a
      // note naming those Slack refused (a missing files:write scope, a file too big)
      sendWithFiles: async (text, files) => {
        const refused: FileRefusal[] = []
        for (const file of files) {
          try {
            await this.uploadFile(channel, threadTs, file)
          } catch (error) {
            refused.push({name: file.name, reason: describeUploadError(error)})
          }
        }
        for (const chunk of splitMessage(text + refusalNote(refused), SLACK_MESSAGE_LIMIT))
          await this.web.chat.postMessage({channel, text: chunk, ...(threadTs ? {thread_ts: threadTs} : {})})
        return refused
      },
      startTyping: () => () => {}, // bots have no typing indicator over Socket Mode
    }
  }

  /**
   * Uploads one file into the conversation (its thread when given) with the Web API's external
   * upload: files.getUploadURLExternal, the bytes to the URL it returns, files.completeUploadExternal.
   */
  async uploadFile(channel: string, threadTs: string | undefined, file: OutboundFile): Promise<void> {
    const upload = {file: file.data, filename: file.name, title: file.name}
    await this.web.filesUploadV2(
      threadTs ? {...upload, channel_id: channel, thread_ts: threadTs} : {...upload, channel_id: channel},
    )
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
function describeUploadError(error: unknown): string {
  const data = (error as {data?: {error?: string; needed?: string}}).data
  if (data?.error === 'missing_scope')
    return `Slack refused it: the app lacks the ${data.needed ?? 'files:write'} scope (add it to the Slack app and reinstall it)`
  return `Slack refused it: ${describeSlackError(error)}`
}

function describeSlackError(error: unknown): string {
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
