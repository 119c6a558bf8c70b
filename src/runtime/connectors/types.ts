import type {AgentRunOutput, InboundMessage} from '../shapes/agent-run-contract.js'
import type {FileRefusal, OutboundFile} from '../shapes/outbound-file.js'

/** How the gateway answers one inbound message on the platform it came from. */
export interface Delivery {
  /** Sends the text, split into as many ordered messages as the platform's size limit needs. */
  send(text: string): Promise<void>
  /**
   * Sends the text with files, through the platform's own upload API. A file the platform refuses
   * never costs the text: it goes out with a note naming the file and the reason, and the refusal is
   * returned. Absent where the conversation cannot carry files.
   */
  sendWithFiles?(text: string, files: OutboundFile[]): Promise<FileRefusal[]>
  /** Shows "typing…" until the returned function is called (no-op where the platform has none). */
  startTyping(): () => void
}

export type InboundHandler = (message: InboundMessage, delivery: Delivery) => void

export type ConnectorState = 'connecting' | 'connected' | 'disconnected' | 'stopped'

export interface Connector {
  /** `agent-id/type` (plus `#n` when an agent has two of a type): names the connector in logs. */
  readonly name: string
  readonly type: string
  readonly agentId: string
  readonly state: ConnectorState
  /** Why it is not connected, for /healthz (see ConnectorStatus.problem); undefined when that is no problem. */
  readonly problem?: string
  /** Connects in the background and keeps reconnecting; never throws for a connection problem. */
  start(): void
  /** Disconnects for good. */
  stop(): Promise<void>
  /** Sends to a conversation without a message to answer (a reply owed from before a restart); needs `connected`. */
  deliveryTo(channelId: string, threadId?: string): Delivery
}

export interface ConnectorContext {
  name: string
  agentId: string
  /** One line per state change, for the operator. */
  log: (line: string) => void
  onMessage: InboundHandler
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
}

export interface DispatchTicket {
  runId: string
  accepted: boolean
  /** Settles once the reply went out (or could not); never rejects. */
  done: Promise<DispatchOutcome>
}
