import type {ConnectorState} from './types.js'

/** A first connection still not made after this long is a problem /healthz names. */
const FIRST_CONNECT_GRACE_MS = 30_000
/** Our connectors' words for a platform that refuses the bot (its token, its intents): retrying alone will not help. */
const REFUSAL = /\brefused the (bot token|token|intents)\b/i

/** A connector's state, logged once per change as `connector NAME: STATE (detail)`. */
export class ConnectorStatus {
  private current: ConnectorState = 'disconnected'
  private attempted = false
  /** Why it is not connected, since it lost or failed a connection; cleared once connected. */
  private failure: string | undefined
  private connectingSince: number | undefined

  constructor(
    private readonly name: string,
    private readonly log: (line: string) => void,
  ) {}

  get state(): ConnectorState {
    return this.current
  }

  set(state: ConnectorState, detail?: string): void {
    if (state === this.current && detail === undefined) return
    // a retry after a failure: its outcome (connected, or disconnected with the next delay) is the news
    const quiet = state === 'connecting' && this.current === 'disconnected' && this.attempted
    this.attempted = true
    if (state === 'connected' || state === 'stopped') this.failure = undefined
    else if (state === 'disconnected' || (state === 'connecting' && this.current === 'connected'))
      this.failure = detail ?? state
    this.connectingSince = state === 'connecting' ? (this.connectingSince ?? Date.now()) : undefined
    this.current = state
    if (quiet) return
    this.log(`connector ${this.name}: ${state}${detail ? ` (${detail})` : ''}`)
  }

  /**
   * What /healthz says of it while it is not connected, e.g. `reconnecting: connect ECONNREFUSED
   * …; reconnecting in 4 s` or `refused: the server refused the bot token (HTTP 401); check
   * bot_token`; undefined while connected, stopped, or still within its first attempt's grace.
   */
  problem(now = Date.now()): string | undefined {
    if (this.failure) return `${REFUSAL.test(this.failure) ? 'refused' : 'reconnecting'}: ${this.failure}`
    if (
      this.current === 'connecting' &&
      this.connectingSince !== undefined &&
      now - this.connectingSince > FIRST_CONNECT_GRACE_MS
    ) {
      return `still connecting after ${Math.round((now - this.connectingSince) / 1000)} s`
    }
    return undefined
  }

  /** A line about this connector that is not a state change (a failed reply, a skipped event). */
  note(line: string): void {
    this.log(`connector ${this.name}: ${line}`)
  }
}
