import type {InboundMessage} from '../agent-run/contract.js'

/** How the gateway answers one inbound message on the platform it came from. */
export interface Delivery {
  /** Sends the text, split into as many ordered messages as the platform's size limit needs. */
  send(text: string): Promise<void>
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
