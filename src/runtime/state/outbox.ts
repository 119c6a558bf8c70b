import type {GatewayDb} from './gateway-db.js'

/** Where a chat reply goes: a connector (by name) and one of its conversations. */
export interface ReplyAddress {
  connector: string
  channelId: string
  threadId?: string
}

/**
 * One ordered piece of a reply. Only text chunks exist today; an uploaded file becomes another
 * kind here, delivered in its place among the chunks.
 */
export interface ReplyPart {
  kind: 'text'
  content: string
}

export interface OutboxReply extends ReplyAddress {
  id: number
  runId: string
  createdAt: number
  attempts: number
  lastError: string | null
}

export interface PendingPart extends ReplyPart {
  seq: number
}

export type DeliveryOutcome = {delivered: true} | {undeliverable: string}

interface OutboxRow {
  id: number
  run_id: string
  connector: string
  channel_id: string
  thread_id: string | null
  created_at: number
  attempts: number
  last_error: string | null
}

/**
 * The durable outbox in gateway.db: every chat reply, split into ordered parts, is written here
 * before its first send attempt; each part is marked once the platform took it; the reply leaves
 * the outbox when all went out or when it is given up on, and its run record keeps the outcome
 * (`runs.delivery`). A gateway that dies mid-delivery leaves the rest here for the next one.
 */
export class Outbox {
  constructor(private readonly db: GatewayDb) {}

  /** Writes the reply and marks its run `pending`; returns the reply's id. */
  add(runId: string, address: ReplyAddress, parts: ReplyPart[], createdAt = Date.now()): number {
    return this.db.transaction(() => {
      const id = Number(
        this.db
          .prepare(`INSERT INTO outbox (run_id, connector, channel_id, thread_id, created_at) VALUES (?, ?, ?, ?, ?)`)
          .run(runId, address.connector, address.channelId, address.threadId ?? null, createdAt).lastInsertRowid,
      )
      const insert = this.db.prepare(`INSERT INTO outbox_parts (reply_id, seq, kind, content) VALUES (?, ?, ?, ?)`)
      parts.forEach((part, seq) => insert.run(id, seq, part.kind, part.content))
      this.db
        .prepare(`UPDATE runs SET delivery = 'pending', delivery_error = NULL, delivered_at = NULL WHERE id = ?`)
        .run(runId)
      return id
    })()
  }

  /** Every reply still to deliver, oldest first. */
  pending(): OutboxReply[] {
    return (this.db.prepare('SELECT * FROM outbox ORDER BY id').all() as OutboxRow[]).map(toReply)
  }

  /** The oldest reply still to deliver to one conversation. */
  next(address: ReplyAddress): OutboxReply | undefined {
    const row = this.db
      .prepare('SELECT * FROM outbox WHERE connector = ? AND channel_id = ? AND thread_id IS ? ORDER BY id LIMIT 1')
      .get(address.connector, address.channelId, address.threadId ?? null) as OutboxRow | undefined
    return row && toReply(row)
  }

  /** The first part of a reply not yet sent. */
  nextPart(replyId: number): PendingPart | undefined {
    return this.db
      .prepare(
        'SELECT seq, kind, content FROM outbox_parts WHERE reply_id = ? AND sent_at IS NULL ORDER BY seq LIMIT 1',
      )
      .get(replyId) as PendingPart | undefined
  }

  /** How many of a reply's parts went out already. */
  sentParts(replyId: number): number {
    return (
      this.db
        .prepare('SELECT count(*) AS n FROM outbox_parts WHERE reply_id = ? AND sent_at IS NOT NULL')
        .get(replyId) as {n: number}
    ).n
  }

  partSent(replyId: number, seq: number): void {
    this.db.prepare('UPDATE outbox_parts SET sent_at = ? WHERE reply_id = ? AND seq = ?').run(Date.now(), replyId, seq)
  }

  /** A failed attempt that will be retried: kept for the operator (and the next gateway). */
  attemptFailed(replyId: number, error: string): void {
    this.db.prepare('UPDATE outbox SET attempts = attempts + 1, last_error = ? WHERE id = ?').run(error, replyId)
  }

  /** The reply leaves the outbox; its run record says how it ended. */
  finish(reply: OutboxReply, outcome: DeliveryOutcome): void {
    this.db.transaction(() => {
      this.db.prepare('DELETE FROM outbox WHERE id = ?').run(reply.id)
      this.db
        .prepare(`UPDATE runs SET delivery = ?, delivery_error = ?, delivered_at = ? WHERE id = ?`)
        .run(
          'delivered' in outcome ? 'delivered' : 'undeliverable',
          'undeliverable' in outcome ? outcome.undeliverable : null,
          Date.now(),
          reply.runId,
        )
    })()
  }

  /** Replies given up on since `since` (ms since epoch), for /healthz. */
  undeliverableSince(since: number): number {
    return (
      this.db
        .prepare(`SELECT count(*) AS n FROM runs WHERE delivery = 'undeliverable' AND delivered_at >= ?`)
        .get(since) as {n: number}
    ).n
  }

  get pendingCount(): number {
    return (this.db.prepare('SELECT count(*) AS n FROM outbox').get() as {n: number}).n
  }
}

function toReply(row: OutboxRow): OutboxReply {
  return {
    id: row.id,
    runId: row.run_id,
    connector: row.connector,
    channelId: row.channel_id,
    ...(row.thread_id === null ? {} : {threadId: row.thread_id}),
    createdAt: row.created_at,
    attempts: row.attempts,
    lastError: row.last_error,
  }
}
