import {
  Client,
  DiscordAPIError,
  Events,
  GatewayIntentBits,
  HTTPError,
  Partials,
  RateLimitError,
  REST,
  SimpleShardingStrategy,
  type ClientOptions,
  type Message,
  type SessionInfo,
  type WebSocketOptions,
} from 'discord.js'
import type {InboundMessage} from '../shapes/agent-run-contract.js'
import {downloadFile, type AllowedOrigin} from '../http/download.js'
import type {IncomingFile} from './attachments.js'
import {DEFAULT_BACKOFF, type BackoffOptions} from './backoff.js'
import type {ConnectorAudience} from '../config/types.js'
import {listensTo} from './audience.js'
import {ReconnectingConnector} from './reconnecting-connector.js'
import {DeliveryError, retryableStatus} from './delivery-error.js'
import {keepTyping} from './typing.js'
import type {ConnectorContext, Conversation, ReplyPacing} from './types.js'
import type {OutboundFile} from '../shapes/outbound-file.js'

export const DISCORD_MESSAGE_LIMIT = 2000

/** Where attachment URLs point: Discord's CDN, public addresses only, no token (its URLs are signed). */
const DISCORD_FILE_ORIGINS = ['https://cdn.discordapp.com', 'https://media.discordapp.net']

export interface DiscordTimings {
  /** Between login attempts when the client cannot connect at all (the library resumes dropped sessions itself). */
  backoff: BackoffOptions
  typingIntervalMs: number
  /** Extra client options (tests turn off the 5 s identify throttle here). */
  clientOptions?: Partial<ClientOptions>
  /** Posting to a channel is limited to 5 messages per 5 s. */
  pacing: ReplyPacing
}

export const DEFAULT_DISCORD_TIMINGS: DiscordTimings = {
  backoff: DEFAULT_BACKOFF,
  typingIntervalMs: 8000,
  pacing: {burst: 5, perSecond: 1},
}

/** @discordjs/ws waits this long between its own attempts to get a dropped session back. */
const LIBRARY_RETRY_MS = 500
/** A close without a close frame: the network, not Discord, ended the connection. */
const ABNORMAL_CLOSURE = 1006

/**
 * discord.js's sharding strategy, except that a session survives a reconnect that failed for
 * network reasons. @discordjs/ws forgets the session when the attempt to resume fails to connect
 * at all (a refused or reset connection), and then identifies anew: Discord starts a new session
 * and never replays what was sent in between. Keeping it makes the next attempt a RESUME; should
 * Discord refuse that (an invalid session, after a fresh HELLO), the library identifies as before.
 */
const sessionKeepingStrategy: NonNullable<WebSocketOptions['buildStrategy']> = (manager) => {
  const options = manager.options as {updateSessionInfo: (shardId: number, info: SessionInfo | null) => unknown}
  const update = options.updateSessionInfo
  const droppedByNetwork = new Set<number>()
  // @discordjs/ws's own event names (discord.js exports another WebSocketShardEvents)
  const events = manager as unknown as {
    on(event: string, listener: (payload: {shardId: number; code?: number}) => void): void
  }
  events.on('closed', ({code, shardId}) => {
    if (code === ABNORMAL_CLOSURE) droppedByNetwork.add(shardId)
  })
  events.on('hello', ({shardId}) => droppedByNetwork.delete(shardId))
  options.updateSessionInfo = (shardId, info) => {
    if (info === null && droppedByNetwork.has(shardId)) return undefined
    return update(shardId, info)
  }
  return new PromptlyClosingStrategy(manager)
}

/** How long a shard's orderly close may wait for Discord's answer before its socket is cut. */
const CLOSE_ANSWER_MS = 1000

/** The part of a shard's websocket (ws's or the global one) a stop needs; a private field of the library's shard. */
type ShardConnection = {
  readyState: number
  onerror: ((event: unknown) => void) | null
  terminate?(): void
  close(): void
}

/**
 * @discordjs/ws's destroy waits, without a bound, for the server to answer its close frame (so a
 * stalled Gateway held `serve`'s stop for ws's 30 s), and drops the error handler of a socket
 * still connecting, whose later error then became an uncaught exception in `serve`. Here every
 * socket the shards had is cut after a short wait, with an error handler kept on.
 */
class PromptlyClosingStrategy extends SimpleShardingStrategy {
  override async destroy(options?: Parameters<SimpleShardingStrategy['destroy']>[0]): Promise<void> {
    const shards = (this as unknown as {shards: Map<number, {connection: ShardConnection | null}>}).shards
    const connections = [...shards.values()].flatMap((shard) => (shard.connection ? [shard.connection] : []))
    let timer: NodeJS.Timeout | undefined
    const answered = new Promise<void>((resolve) => (timer = setTimeout(resolve, CLOSE_ANSWER_MS)))
    await Promise.race([super.destroy(options), answered])
    clearTimeout(timer)
    for (const connection of connections) {
      connection.onerror = () => {}
      if (connection.readyState === CLOSED) continue
      if (connection.terminate) connection.terminate()
      else connection.close()
    }
  }
}

/** WebSocket.CLOSED, for ws's socket and the global one alike. */
const CLOSED = 3

/**
 * Discord through discord.js (Gateway v10): Guilds, GuildMessages, MessageContent and
 * DirectMessages intents, replies in the message's channel (a thread is a channel). The
 * library resumes dropped sessions and handles rate limits; a login that fails (bad token,
 * unreachable API) or a session Discord ends for good is retried here with backoff.
 */
export class DiscordConnector extends ReconnectingConnector {
  readonly type = 'discord'
  readonly messageLimit = DISCORD_MESSAGE_LIMIT
  readonly pacing: ReplyPacing
  private client: Client | undefined
  /**
   * Replies go through their own REST client, usable while the gateway session reconnects. It
   * neither waits out a rate limit nor retries at once: it says how long to wait (RateLimitError),
   * and the outbox waits without holding anything else.
   */
  private readonly rest: REST
  private warnedEmptyContent = false

  constructor(
    private readonly config: {bot_token: string; guild_ids: string[]; api_url?: string} & ConnectorAudience,
    private readonly context: ConnectorContext,
    private readonly timings: DiscordTimings = DEFAULT_DISCORD_TIMINGS,
  ) {
    super(context, timings.backoff)
    this.pacing = timings.pacing
    this.rest = new REST({
      ...(config.api_url ? {api: config.api_url} : {}),
      retries: 0,
      rejectOnRateLimit: () => true,
    }).setToken(config.bot_token)
  }

  protected async disconnect(): Promise<void> {
    const client = this.client
    this.client = undefined
    if (client) await destroyQuietly(client)
  }

  private buildClient(): Client {
    const extra = this.timings.clientOptions ?? {}
    return new Client({
      intents: [
        GatewayIntentBits.Guilds,
        GatewayIntentBits.GuildMessages,
        GatewayIntentBits.MessageContent,
        GatewayIntentBits.DirectMessages,
      ],
      partials: [Partials.Channel], // DM channels are not cached before their first message
      ...extra,
      ws: {...extra.ws, buildStrategy: sessionKeepingStrategy},
      rest: {...extra.rest, ...(this.config.api_url ? {api: this.config.api_url} : {})},
    })
  }

  protected async connect(): Promise<void> {
    if (this.stopped) return
    this.status.connecting()
    const client = this.buildClient()
    this.client = client
    client.on(Events.ClientReady, (ready) => {
      if (client !== this.client) return
      this.backoff.reset()
      this.status.connected(`as ${ready.user.tag}, ${ready.guilds.cache.size} guild(s)`)
    })
    // the library reconnects a dropped session itself, every half second, resuming when it can
    client.on(Events.ShardReconnecting, () => {
      if (client === this.client) this.status.down('connection lost, resuming the session', LIBRARY_RETRY_MS)
    })
    client.on(Events.ShardResume, (_shard, replayed) => {
      if (client === this.client) this.status.connected(`session resumed, ${replayed} event(s) replayed`)
    })
    // a session Discord would not resume: a new one (what was sent meanwhile is not replayed)
    client.on(Events.ShardReady, () => {
      if (client === this.client && client.isReady())
        this.status.connected('new session; messages sent while it was down were not replayed')
    })
    client.on(Events.ShardDisconnect, (event) => {
      if (client === this.client) this.retry(client, `Discord closed the session for good (code ${event.code})`)
    })
    client.on(Events.Invalidated, () => {
      if (client === this.client) this.retry(client, 'Discord invalidated the session')
    })
    client.on(Events.Error, (error) => {
      if (client === this.client) this.status.note(`client error: ${error.message}`)
    })
    client.on(Events.MessageCreate, (message) => {
      try {
        this.onMessage(client, message)
      } catch (error) {
        // a message of an unexpected shape must not take the gateway down
        this.status.note(`ignored a message it could not handle: ${(error as Error).message}`)
      }
    })
    try {
      await client.login(this.config.bot_token)
    } catch (error) {
      if (client === this.client) this.retry(client, describeLoginError(error))
    }
  }

  private retry(client: Client, why: string): void {
    if (this.stopped || client !== this.client) return
    this.client = undefined
    void destroyQuietly(client)
    const delay = this.backoff.next()
    this.status.down(why, delay)
    clearTimeout(this.reconnectTimer)
    this.reconnectTimer = setTimeout(() => void this.connect(), delay)
  }

  async postMessage({channelId}: Omit<Conversation, 'connector'>, content: string): Promise<void> {
    try {
      await this.rest.post(`/channels/${channelId}/messages`, {body: {content, allowed_mentions: {parse: []}}})
    } catch (error) {
      throw describePostError(error, channelId)
    }
  }

  /** One file as a message attachment of its own (a 413 over the upload limit is a refusal, not retried). */
  async postFile({channelId}: Omit<Conversation, 'connector'>, file: OutboundFile): Promise<void> {
    try {
      await this.rest.post(`/channels/${channelId}/messages`, {
        body: {allowed_mentions: {parse: []}},
        files: [{name: file.name, data: file.data, contentType: file.content_type}],
      })
    } catch (error) {
      const failure = describePostError(error, channelId)
      throw failure.retry ? failure : new DeliveryError(`Discord refused it: ${(error as Error).message}`, false)
    }
  }

  private onMessage(client: Client, message: Message): void {
    if (client !== this.client || this.stopped) return
    if (message.author.bot || message.author.id === client.user?.id) return // its own replies and other bots: no loops
    if (message.guildId && this.config.guild_ids.length > 0 && !this.config.guild_ids.includes(message.guildId)) return
    if (!message.content.trim() && message.attachments.size === 0) {
      if (!this.warnedEmptyContent) {
        this.warnedEmptyContent = true
        this.status.note(
          'a message arrived with empty content: enable the MESSAGE CONTENT intent for the bot in the Discord developer portal',
        )
      }
      return
    }
    const place = {
      channelIds: [
        message.channelId,
        ...(message.channel.isThread() && message.channel.parentId ? [message.channel.parentId] : []),
      ],
      isDm: !message.guildId,
      mentioned: client.user ? message.mentions.users.has(client.user.id) : false,
    }
    if (!listensTo(this.config, place)) return
    const postedAt = message.createdTimestamp
    if (!this.catchUp.admit(message.channelId, message.id, postedAt)) return
    if (!this.catchUp.claim(message.channelId, message.id, postedAt)) return
    const inbound: InboundMessage = {
      id: message.id,
      connector: 'discord',
      channel_id: message.channelId,
      user: {
        id: message.author.id,
        name: message.member?.displayName ?? message.author.globalName ?? message.author.username,
      },
      content: message.content,
    }
    const files = [...message.attachments.values()].map((attachment) =>
      this.incomingFile(attachment.url, attachment.name, attachment.contentType, attachment.size),
    )
    const channel = message.channel
    const typing = () =>
      keepTyping(() => (channel.isSendable() ? channel.sendTyping() : undefined), this.timings.typingIntervalMs)
    this.context.onMessage(inbound, this.delivery(message.channelId, undefined, typing), files)
  }

  /** Only Discord's CDN (or the configured api_url's origin, for tests), and never with the bot token. */
  private incomingFile(url: string, name: string, contentType: string | null, size: number): IncomingFile {
    const allowed: AllowedOrigin[] = [
      ...DISCORD_FILE_ORIGINS.map((origin) => ({origin, publicOnly: true})),
      ...(this.config.api_url ? [{origin: new URL(this.config.api_url).origin, publicOnly: false}] : []),
    ]
    return {
      name: name || 'file',
      ...(contentType ? {contentType} : {}),
      ...(Number.isFinite(size) && size >= 0 ? {declaredSize: size} : {}),
      read: ({maxBytes, signal}) => downloadFile(url, {allowed, maxBytes, signal}),
    }
  }
}

/** A failed post as the outbox sees it: wait and retry (rate limit, 5xx, unreachable) or give up (4xx). */
function describePostError(error: unknown, channelId: string): DeliveryError {
  if (error instanceof RateLimitError)
    return new DeliveryError(`Discord rate-limited posts to channel ${channelId}`, true, error.retryAfter)
  if (error instanceof DiscordAPIError)
    return new DeliveryError(`Discord refused the post to channel ${channelId}: ${error.message}`, false)
  if (error instanceof HTTPError)
    return new DeliveryError(`Discord answered HTTP ${error.status} to a post`, retryableStatus(error.status))
  const cause = (error as {cause?: {code?: string}}).cause?.code
  return new DeliveryError(`cannot reach Discord: ${cause ?? (error as Error).message ?? String(error)}`, true)
}

function describeLoginError(error: unknown): string {
  const code = (error as {code?: string}).code
  if (code === 'TokenInvalid') return 'Discord refused the bot token (TokenInvalid); check bot_token'
  if (code === 'DisallowedIntents')
    return 'Discord refused the intents: enable MESSAGE CONTENT for the bot in the developer portal'
  return `login failed: ${(error as Error).message ?? String(error)}`
}

async function destroyQuietly(client: Client): Promise<void> {
  client.removeAllListeners()
  client.on(Events.Error, () => {})
  try {
    await client.destroy()
  } catch {
    // already torn down
  }
}
