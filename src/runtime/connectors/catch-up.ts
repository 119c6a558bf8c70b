import {formatDelay} from './backoff.js'
import type {ConnectorStatus} from './connector-status.js'
import {RecentIds} from './recent-ids.js'

export interface CatchUpLimits {
  /** A message sent while the connector was down is answered only if it is at most this old. */
  maxAgeMs: number
  /** At most this many such messages are answered after one outage; the rest are skipped. */
  maxMessages: number
  /**
   * A message dated this little before the connection was made counts as live, not as caught up:
   * the platform's clock and ours differ, and a message posted while our side still handled the
   * handshake arrives on the live connection.
   */
  liveMarginMs: number
}

export const DEFAULT_CATCH_UP: CatchUpLimits = {maxAgeMs: 30 * 60_000, maxMessages: 20, liveMarginMs: 10_000}

/** How long skipped messages are counted before one line reports them. */
const REPORT_AFTER_MS = 1000

/**
 * Which inbound messages a connector hands to its agent: each message once (a platform's
 * redelivery, an @mention that arrives twice, a replay after a restart), and of those sent while
 * the connector was down (Slack's redelivery, Discord's replay on resume) only the recent ones,
 * up to a count per outage. `claim` records the message durably (gateway.db) as it is handed on.
 */
export class CatchUpGate {
  private readonly seen = new RecentIds()
  private outage = -1
  private caughtUp = 0
  private skipped = {old: 0, over: 0}
  private reportTimer: NodeJS.Timeout | undefined

  constructor(
    private readonly status: ConnectorStatus,
    private readonly claimDurably: ((channelId: string, messageId: string, postedAt: number) => boolean) | undefined,
    private readonly limits: CatchUpLimits = DEFAULT_CATCH_UP,
  ) {}

  /**
   * First look at a message: false for one seen already in this process, or sent while the
   * connector was down and outside the catch-up bounds.
   */
  admit(channelId: string, messageId: string, postedAt: number, now = Date.now()): boolean {
    if (!this.seen.firstSeen(`${channelId}\0${messageId}`)) return false
    const connectedSince = this.status.connectedSince
    if (connectedSince !== undefined && postedAt >= connectedSince - this.limits.liveMarginMs) return true
    if (this.outage !== this.status.outages) {
      this.outage = this.status.outages
      this.caughtUp = 0
    }
    if (now - postedAt > this.limits.maxAgeMs) return this.skip('old')
    if (this.caughtUp >= this.limits.maxMessages) return this.skip('over')
    this.caughtUp++
    return true
  }

  /**
   * As the message is handed to the agent: false when it was handed on before (by this gateway or
   * one before it). A database that cannot answer does not cost the user an answer.
   */
  claim(channelId: string, messageId: string, postedAt: number): boolean {
    if (!this.claimDurably) return true
    try {
      return this.claimDurably(channelId, messageId, postedAt)
    } catch (error) {
      this.status.note(`could not record message ${messageId} as answered: ${(error as Error).message}`)
      return true
    }
  }

  private skip(why: 'old' | 'over'): false {
    this.skipped[why]++
    this.reportTimer ??= setTimeout(() => this.report(), REPORT_AFTER_MS).unref()
    return false
  }

  private report(): void {
    this.reportTimer = undefined
    const {old, over} = this.skipped
    this.skipped = {old: 0, over: 0}
    const reasons = [
      old > 0 ? `${old} older than ${formatDelay(this.limits.maxAgeMs)}` : '',
      over > 0 ? `${over} beyond the ${this.limits.maxMessages} answered after one outage` : '',
    ].filter(Boolean)
    this.status.note(`skipped ${old + over} message(s) sent while it was disconnected: ${reasons.join(', ')}`)
  }

  stop(): void {
    clearTimeout(this.reportTimer)
    this.reportTimer = undefined
  }
}
