import {Backoff, type BackoffOptions} from './backoff.js'
import {ConnectorStatus} from './connector-status.js'
import {CatchUpGate} from './catch-up.js'
import {splitMessage} from './split-message.js'
import type {Connector, ConnectorContext, ConnectorState, Conversation, Delivery, ReplyPacing} from './types.js'
import {refusalNote, type FileRefusal, type OutboundFile} from '../shapes/outbound-file.js'

/**
 * What the platform connectors share: names, the logged status, the reconnect backoff, the
 * stopped flag and the pending reconnect. A platform supplies `connect` (which never throws and
 * schedules its own retries in `reconnectTimer`) and `disconnect` (closing its client for good).
 */
export abstract class ReconnectingConnector implements Connector {
  abstract readonly type: string
  readonly name: string
  readonly agentId: string
  protected readonly status: ConnectorStatus
  protected readonly backoff: Backoff
  /** Hands each message on once, and of those sent while it was down only the recent ones. */
  protected readonly catchUp: CatchUpGate
  protected reconnectTimer: NodeJS.Timeout | undefined
  protected stopped = false

  constructor(context: ConnectorContext, backoff: BackoffOptions) {
    this.name = context.name
    this.agentId = context.agentId
    this.status = new ConnectorStatus(context.name, context.log)
    this.backoff = new Backoff(backoff)
    this.catchUp = new CatchUpGate(this.status, context.claim, context.catchUp)
  }

  get state(): ConnectorState {
    return this.status.state
  }

  get problem(): string | undefined {
    return this.status.problem()
  }

  get nextAttempt(): Date | undefined {
    return this.status.nextAttempt
  }

  start(): void {
    this.stopped = false
    void this.connect()
  }

  async stop(): Promise<void> {
    this.stopped = true
    clearTimeout(this.reconnectTimer)
    await this.disconnect()
    this.catchUp.stop()
    this.status.stopped()
  }

  abstract readonly messageLimit: number
  abstract readonly pacing: ReplyPacing

  abstract postMessage(conversation: Omit<Conversation, 'connector'>, text: string): Promise<void>

  deliveryTo(channelId: string, threadId?: string): Delivery {
    return this.delivery(channelId, threadId, () => () => {})
  }

  /** The answer to a message in a conversation: through the outbox, or posted part by part now. */
  protected delivery(channelId: string, threadId: string | undefined, startTyping: () => () => void): Delivery {
    const conversation = {channelId, ...(threadId ? {threadId} : {})}
    return {
      send: async (text) => {
        for (const chunk of splitMessage(text, this.messageLimit)) await this.postMessage(conversation, chunk)
      },
      ...(this.postFile
        ? {sendWithFiles: (text: string, files: OutboundFile[]) => this.postEachThenText(conversation, text, files)}
        : {}),
      startTyping,
      conversation: {connector: this.name, ...conversation},
    }
  }

  /**
   * Used only when the outbox cannot be written: each file posted once (one refused costs only
   * itself), then the text, split to the platform's limit, with a note naming those refused.
   */
  private async postEachThenText(
    conversation: Omit<Conversation, 'connector'>,
    text: string,
    files: OutboundFile[],
  ): Promise<FileRefusal[]> {
    const refused: FileRefusal[] = []
    for (const file of files) {
      try {
        await this.postFile!(conversation, file)
      } catch (error) {
        refused.push({name: file.name, reason: (error as Error).message})
      }
    }
    for (const chunk of splitMessage(text + refusalNote(refused), this.messageLimit))
      await this.postMessage(conversation, chunk)
    return refused
  }

  /**
   * One attempt to post one file as a message of its own, through the platform's upload API; a
   * failure is a DeliveryError (a file too large is not worth retrying). Absent where the
   * connector cannot upload.
   */
  postFile?(conversation: Omit<Conversation, 'connector'>, file: OutboundFile): Promise<void>

  protected abstract connect(): void | Promise<void>

  /** Closes the current connection for good; called by `stop`, after any pending reconnect is cancelled. */
  protected abstract disconnect(): Promise<void>
}
