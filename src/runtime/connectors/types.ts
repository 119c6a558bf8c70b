import type {AgentRunOutput, InboundMessage, MessageAttachment} from '../shapes/agent-run-contract.js'
import type {IncomingFile} from './attachments.js'
import type {CatchUpLimits} from './catch-up.js'
import type {FileRefusal, OutboundFile} from '../shapes/outbound-file.js'

/** How the gateway answers one inbound message on the platform it came from. */
export interface Delivery {
  /** Sends the text now, split into as many ordered messages as the platform's size limit needs. */
  send(text: string): Promise<void>
  /**
   * Sends the text with files now: web chat's answer, or a chat platform's reply when the outbox
   * cannot be written (the outbox carries them otherwise). A file the platform refuses never costs
   * the text: it goes out with a note naming the file and the reason, and the refusal is returned.
   * Absent where the conversation cannot carry files.
   */
  sendWithFiles?(text: string, files: OutboundFile[]): Promise<FileRefusal[]>
  /** Shows "typing…" until the returned function is called (no-op where the platform has none). */
  startTyping(): () => void
  /**
   * Set by the chat platforms: the conversation to answer, through the gateway's durable outbox
   * instead of `send` (web chat and local send answer in their own response and have none).
   */
  conversation?: Conversation
}

/** A chat platform conversation: the connector (by name), its channel and thread. */
export interface Conversation {
  connector: string
  channelId: string
  threadId?: string
}

/** A platform's documented posting rate: `burst` messages at once, then `perSecond`. */
export interface ReplyPacing {
  burst: number
  perSecond: number
}

/** A message and the files it came with (received into the workspace when its run starts). */
export type InboundHandler = (message: InboundMessage, delivery: Delivery, files?: IncomingFile[]) => void

/**
 * `reconnecting`: lost or failed, the next attempt is due (Connector.nextAttempt); `refused`: the
 * platform refused the bot's credentials, retried all the same in case the operator fixes them.
 */
export type ConnectorState = 'connecting' | 'connected' | 'reconnecting' | 'refused' | 'stopped'

export interface Connector {
  /** `agent-id/type` (plus `#n` when an agent has two of a type): names the connector in logs. */
  readonly name: string
  readonly type: string
  readonly agentId: string
  readonly state: ConnectorState
  /** Why it is not connected, for /healthz (see ConnectorStatus.problem); undefined when that is no problem. */
  readonly problem?: string
  /** When the next connection attempt is due, while reconnecting or refused. */
  readonly nextAttempt?: Date
  /** Connects in the background and keeps reconnecting; never throws for a connection problem. */
  start(): void
  /** Disconnects for good. */
  stop(): Promise<void>
  /** Sends to a conversation without a message to answer (a reply owed from before a restart); needs `connected`. */
  deliveryTo(channelId: string, threadId?: string): Delivery
  /** The platform's longest message, in characters: the outbox splits replies to fit. */
  readonly messageLimit: number
  /** How fast the outbox may post through this connector. */
  readonly pacing: ReplyPacing
  /**
   * One attempt to post one message (at most `messageLimit` characters) to a conversation; a
   * failure is a DeliveryError that says whether, and after how long, to try again.
   */
  postMessage(conversation: Omit<Conversation, 'connector'>, text: string): Promise<void>
  /**
   * One attempt to post one file, as a message of its own, through the platform's upload API; a
   * failure is a DeliveryError as for postMessage. Absent where the platform takes no files.
   */
  postFile?(conversation: Omit<Conversation, 'connector'>, file: OutboundFile): Promise<void>
}

export interface ConnectorContext {
  name: string
  agentId: string
  /** One line per state change, for the operator. */
  log: (line: string) => void
  onMessage: InboundHandler
  /**
   * Records durably (gateway.db) that this connector handed a message on: false when it did
   * before, across reconnects and restarts. Without it, messages are told apart in memory only.
   */
  claim?: (channelId: string, messageId: string, postedAt: number) => boolean
  /** Bounds of what is answered of the messages sent while the connector was down (tests shorten them). */
  catchUp?: CatchUpLimits
}

/**
 * What a connector that follows its message to the end (web chat, local send) needs of the
 * gateway: hand the message over and learn how it ended. The gateway's Dispatcher is one; the
 * connectors own this interface so that they do not import the gateway that imports them.
 */
export interface MessageDispatcher {
  /** False once the gateway is stopping. */
  readonly accepting: boolean
  dispatch(agentId: string, message: InboundMessage, delivery: Delivery, extras?: DispatchExtras): DispatchTicket
}

/**
 * What the sender of one message adds: a way to stop its run, and its progress lines (`send` over
 * the local socket).
 */
export interface DispatchExtras {
  /** Aborting stops the run (a reason such as 'SIGINT' is forwarded to it first). */
  signal?: AbortSignal
  onLog?: (line: string) => void
  /** Asked when the message's turn comes: a reason hands it back to its sender unrun (no record, no reply). */
  notRunBecause?: () => string | undefined
  /** The message's files, received into the agent's workspace when its run starts. */
  files?: IncomingFile[]
  /**
   * Called once when the message's turn comes, before its run starts (or it is handed back or
   * found withdrawn); never for a message refused or dropped before its turn.
   */
  onTurn?: () => void
}

export type DispatchStatus = 'ok' | 'failed' | 'interrupted' | 'rejected'

export interface DispatchOutcome {
  runId: string
  status: DispatchStatus
  /** Exactly what was sent to the user. */
  reply: string
  output?: AgentRunOutput
  /** Why a `rejected` message never ran. */
  rejectedBecause?: 'busy' | 'stopping'
  /** Why a message was handed back unrun when its turn came (DispatchExtras.notRunBecause). */
  notRunBecause?: string
  /** The message's files as they reached the workspace (or were skipped). */
  attachments?: MessageAttachment[]
}

export interface DispatchTicket {
  runId: string
  accepted: boolean
  /** Settles once the reply went out, could not, or (chat platforms) is in the outbox; never rejects. */
  done: Promise<DispatchOutcome>
}
