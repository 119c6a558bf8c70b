import {
  Client,
  Events,
  GatewayIntentBits,
  Partials,
  type ClientOptions,
  type Message,
  type SendableChannels,
} from 'discord.js'
import type {InboundMessage} from '../shapes/agent-run-contract.js'
import {DEFAULT_BACKOFF, formatDelay, type BackoffOptions} from './backoff.js'
import {ReconnectingConnector} from './reconnecting-connector.js'
import {splitMessage} from './split-message.js'
import {keepTyping} from './typing.js'
import type {ConnectorContext, Delivery} from './types.js'
import {refusalNote, type FileRefusal, type OutboundFile} from '../shapes/outbound-file.js'

export const DISCORD_MESSAGE_LIMIT = 2000

export interface DiscordTimings {
  /** Between login attempts when the client cannot connect at all (the library resumes dropped sessions itself). */
  backoff: BackoffOptions
  typingIntervalMs: number
  /** Extra client options (tests turn off the 5 s identify throttle here). */
  clientOptions?: Partial<ClientOptions>
}

export const DEFAULT_DISCORD_TIMINGS: DiscordTimings = {backoff: DEFAULT_BACKOFF, typingIntervalMs: 8000}

/**
 * Discord through discord.js (Gateway v10): Guilds, GuildMessages, MessageContent and
 * DirectMessages intents, replies in the message's channel (a thread is a channel). The
 * library resumes dropped sessions and handles rate limits; a login that fails (bad token,
 * unreachable API) or a session Discord ends for good is retried here with backoff.
 */
export class DiscordConnector extends ReconnectingConnector {
  readonly type = 'discord'
  private client: Client | undefined
  private warnedEmptyContent = false

  constructor(
    private readonly config: {bot_token: string; guild_ids: string[]; api_url?: string},
    private readonly context: ConnectorContext,
    private readonly timings: DiscordTimings = DEFAULT_DISCORD_TIMINGS,
  ) {
    super(context, timings.backoff)
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
      rest: {...extra.rest, ...(this.config.api_url ? {api: this.config.api_url} : {})},
    })
  }

  protected async connect(): Promise<void> {
    if (this.stopped) return
    this.status.set('connecting')
    const client = this.buildClient()
    this.client = client
    client.on(Events.ClientReady, (ready) => {
      if (client !== this.client) return
      this.backoff.reset()
      this.status.set('connected', `as ${ready.user.tag}, ${ready.guilds.cache.size} guild(s)`)
    })
    client.on(Events.ShardReconnecting, () => {
      if (client === this.client) this.status.set('connecting', 'connection lost, resuming')
    })
    client.on(Events.ShardResume, () => {
      if (client === this.client) this.status.set('connected', 'session resumed')
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
    this.status.set('disconnected', `${why}; reconnecting in ${formatDelay(delay)}`)
    clearTimeout(this.reconnectTimer)
    this.reconnectTimer = setTimeout(() => void this.connect(), delay)
  }

  deliveryTo(channelId: string): Delivery {
    return this.delivery(
      () => this.sendableChannel(channelId),
      () => () => {},
    )
  }

  /**
   * Text split to Discord's limit; files each as their own message first (one refused, e.g. 413
   * over the upload limit, costs only itself), then the text with a note naming those refused.
   */
  private delivery(channelOf: () => Promise<SendableChannels>, startTyping: () => () => void): Delivery {
    const sendText = async (text: string) => {
      const channel = await channelOf()
      for (const chunk of splitMessage(text, DISCORD_MESSAGE_LIMIT))
        await channel.send({content: chunk, allowedMentions: {parse: []}})
    }
    return {
      send: sendText,
      sendWithFiles: async (text, files) => {
        const refused: FileRefusal[] = []
        for (const file of files) {
          try {
            await sendAttachment(await channelOf(), file)
          } catch (error) {
            refused.push({name: file.name, reason: `Discord refused it: ${(error as Error).message}`})
          }
        }
        await sendText(text + refusalNote(refused))
        return refused
      },
      startTyping,
    }
  }

  private async sendableChannel(channelId: string): Promise<SendableChannels> {
    const channel = await this.client?.channels.fetch(channelId)
    if (!channel?.isSendable()) throw new Error(`cannot send to Discord channel ${channelId}`)
    return channel
  }

  private onMessage(client: Client, message: Message): void {
    if (client !== this.client || this.stopped) return
    if (message.author.bot || message.author.id === client.user?.id) return // its own replies and other bots: no loops
    if (message.guildId && this.config.guild_ids.length > 0 && !this.config.guild_ids.includes(message.guildId)) return
    if (!message.content.trim()) {
      if (!this.warnedEmptyContent && message.attachments.size === 0) {
        this.warnedEmptyContent = true
        this.status.note(
          'a message arrived with empty content: enable the MESSAGE CONTENT intent for the bot in the Discord developer portal',
        )
      }
      return
    }
    if (!this.seen.firstSeen(message.id)) return
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
    const channel = message.channel
    this.context.onMessage(
      inbound,
      this.delivery(
        async () => {
          if (!channel.isSendable()) throw new Error(`cannot send to Discord channel ${message.channelId}`)
          return channel
        },
        () =>
          keepTyping(() => (channel.isSendable() ? channel.sendTyping() : undefined), this.timings.typingIntervalMs),
      ),
    )
  }
}

/** Posts one file as a message attachment of the channel (a thread is a channel). */
export async function sendAttachment(channel: SendableChannels, file: OutboundFile): Promise<void> {
  await channel.send({files: [{attachment: file.data, name: file.name}], allowedMentions: {parse: []}})
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
