import type {GatewayDb} from './gateway-db.js'

/** How often (in claims) entries older than the window are deleted. */
const PRUNE_EVERY = 200

/**
 * The inbound messages each connector handed to its agent, per channel, for as long as a platform
 * may deliver them again (the catch-up window): a message is claimed once, across reconnects and
 * restarts. The newest `posted_at` of a channel is its high-water mark. Older entries are pruned:
 * a message older than the window is refused by its age before it gets here.
 */
export class InboundLedger {
  private claims = 0
  private readonly insert
  private readonly mark
  private readonly prune

  constructor(
    db: GatewayDb,
    private readonly windowMs: number,
  ) {
    this.insert = db.prepare(
      `INSERT OR IGNORE INTO inbound_handled (connector, channel_id, message_id, posted_at, handled_at) VALUES (?, ?, ?, ?, ?)`,
    )
    this.mark = db.prepare(
      `SELECT max(posted_at) AS posted_at FROM inbound_handled WHERE connector = ? AND channel_id = ?`,
    )
    this.prune = db.prepare(`DELETE FROM inbound_handled WHERE posted_at < ?`)
  }

  /** True the first time a connector hands this message on; false when it did before (a redelivery). */
  claim(connector: string, channelId: string, messageId: string, postedAt: number, now = Date.now()): boolean {
    if (++this.claims % PRUNE_EVERY === 1) this.prune.run(now - this.windowMs)
    return this.insert.run(connector, channelId, messageId, Math.round(postedAt), now).changes === 1
  }

  /** When the newest message of a channel that the connector handled was posted. */
  highWaterMark(connector: string, channelId: string): number | undefined {
    return (this.mark.get(connector, channelId) as {posted_at: number | null} | undefined)?.posted_at ?? undefined
  }
}
