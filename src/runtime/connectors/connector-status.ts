import {formatDelay} from './backoff.js'
import type {ConnectorState} from './types.js'

/** A first connection still not made after this long is a problem /healthz names. */
const FIRST_CONNECT_GRACE_MS = 30_000
/** While a connector stays down for the same reason, one line this often says it still is. */
export const STILL_DOWN_LOG_INTERVAL_MS = 60_000
/** Our connectors' words for a platform that refuses the bot (its token, its intents): retrying alone will not help. */
const REFUSAL = /\brefused the (bot token|token|intents)\b/i

/**
 * A connector's state, logged as `connector NAME: STATE (detail)` when it changes. While it is
 * down, a failed attempt for the same reason as the last one is not logged again, only a summary
 * once a minute: a platform that is down for an hour costs a few dozen lines, not thousands.
 */
export class ConnectorStatus {
  private current: ConnectorState = 'connecting'
  /** Why it is not connected, since it lost or failed a connection; cleared once connected. */
  private failure: string | undefined
  private nextAttemptAt: number | undefined
  private connectingSince: number | undefined = Date.now()
  private downSince: number | undefined
  private connectedAt: number | undefined
  /** Outages so far: a new one starts when a connection is lost or a first attempt fails. */
  private outageCount = 0
  private failedAttempts = 0
  private lastLoggedAt = 0
  private announced = false

  constructor(
    private readonly name: string,
    private readonly log: (line: string) => void,
  ) {}

  get state(): ConnectorState {
    return this.current
  }

  /** When the current connection was made; undefined while not connected. */
  get connectedSince(): number | undefined {
    return this.connectedAt
  }

  /** Since when it is down, while reconnecting or refused. */
  get downSinceTime(): number | undefined {
    return this.downSince
  }

  get outages(): number {
    return this.outageCount
  }

  /** When the next connection attempt is due, while reconnecting or refused. */
  get nextAttempt(): Date | undefined {
    return this.nextAttemptAt === undefined ? undefined : new Date(this.nextAttemptAt)
  }

  /** An attempt starts: the news is its outcome, so only the very first is logged. */
  connecting(detail?: string): void {
    if (this.failure || (this.current === 'connecting' && this.announced)) return
    this.announced = true
    this.connectingSince ??= Date.now()
    this.change('connecting', detail)
  }

  connected(detail?: string): void {
    const outage = this.downSince === undefined ? undefined : Date.now() - this.downSince
    this.failure = undefined
    this.nextAttemptAt = undefined
    this.connectingSince = undefined
    this.downSince = undefined
    this.connectedAt = Date.now()
    this.failedAttempts = 0
    const after = outage === undefined ? '' : `after ${formatDelay(outage)} down`
    this.change('connected', [detail, after].filter(Boolean).join(', ') || undefined)
  }

  /**
   * The connection is lost or an attempt failed; the next one is due in `delayMs`. A platform's
   * refusal of the bot's credentials is `refused`, anything else `reconnecting`.
   */
  down(why: string, delayMs: number): void {
    const now = Date.now()
    const state: ConnectorState = REFUSAL.test(why) ? 'refused' : 'reconnecting'
    const repeat = this.current === state && this.failure === why
    if (this.downSince === undefined) {
      this.downSince = now
      this.outageCount++
    }
    this.connectedAt = undefined
    this.failedAttempts++
    this.failure = why
    this.nextAttemptAt = now + delayMs
    this.connectingSince = undefined
    const detail = `${why}; next attempt in ${formatDelay(delayMs)}`
    if (!repeat) return this.change(state, detail)
    if (now - this.lastLoggedAt < STILL_DOWN_LOG_INTERVAL_MS) return
    this.lastLoggedAt = now
    this.log(
      `connector ${this.name}: still ${state} (${this.failedAttempts} attempts since ${new Date(this.downSince).toISOString()}: ${detail})`,
    )
  }

  stopped(): void {
    this.connectedAt = undefined
    this.failure = undefined
    this.nextAttemptAt = undefined
    this.change('stopped')
  }

  private change(state: ConnectorState, detail?: string): void {
    this.current = state
    this.lastLoggedAt = Date.now()
    this.log(`connector ${this.name}: ${state}${detail ? ` (${detail})` : ''}`)
  }

  /**
   * What /healthz says of it while it is not connected, e.g. `reconnecting: connect ECONNREFUSED
   * …; next attempt at 2026-…Z` or `refused: the server refused the bot token (HTTP 401); check
   * bot_token; next attempt at …`; undefined while connected, stopped, or within its first attempt's grace.
   */
  problem(now = Date.now()): string | undefined {
    if (this.failure) {
      const next =
        this.nextAttemptAt === undefined ? '' : `; next attempt at ${new Date(this.nextAttemptAt).toISOString()}`
      return `${this.current}: ${this.failure}${next}`
    }
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
