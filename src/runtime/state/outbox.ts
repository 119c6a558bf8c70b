import type {GatewayDb} from './gateway-db.js'
import type {OutboundFile} from '../shapes/outbound-file.js'
import {refusalNote} from '../shapes/outbound-file.js'
import type {OutboxSpool} from './outbox-spool.js'

/** Where a chat reply goes: a connector (by name) and one of its conversations. */
export interface ReplyAddress {
  connector: string
  channelId: string
  threadId?: string
}

/** One ordered piece of a reply: a chunk of its text, or a file sent with it. */
export type ReplyPart = {kind: 'text'; content: string} | {kind: 'file'; file: OutboundFile}

/** A file part as stored: its bytes wait in the spool under `spool`. */
export interface SpooledFile {
  name: string
  size: number
  contentType: string
  spool: string
}

export interface OutboxReply extends ReplyAddress {
  id: number
  runId: string
  createdAt: number
  attempts: number
  lastError: string | null
}

export type PendingPart = {seq: number} & ({kind: 'text'; content: string} | ({kind: 'file'} & SpooledFile))

interface PartRow {
  seq: number
  kind: 'text' | 'file'
  content: string
  file_size: number | null
  content_type: string | null
  spool: string | null
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
  constructor(
    private readonly db: GatewayDb,
    private readonly spool: OutboxSpool,
  ) {}

  /**
   * Writes the reply and marks its run `pending`; returns the reply's id. A file part's bytes go
   * to the spool first: a crash before the commit leaves only spool entries, which sweep() removes.
   */
  add(runId: string, address: ReplyAddress, parts: ReplyPart[], createdAt = Date.now()): number {
    const spooled: string[] = []
    try {
      const stored = parts.map((part) => {
        if (part.kind === 'text') return {kind: part.kind, content: part.content, size: null, type: null, spool: null}
        const {name, size, content_type, data} = part.file
        spooled.push(this.spool.put(data))
        return {kind: part.kind, content: name, size, type: content_type, spool: spooled.at(-1) as string}
      })
      return this.db.transaction(() => {
        const id = Number(
          this.db
            .prepare(`INSERT INTO outbox (run_id, connector, channel_id, thread_id, created_at) VALUES (?, ?, ?, ?, ?)`)
            .run(runId, address.connector, address.channelId, address.threadId ?? null, createdAt).lastInsertRowid,
        )
        const insert = this.db.prepare(
          `INSERT INTO outbox_parts (reply_id, seq, kind, content, file_size, content_type, spool) VALUES (?, ?, ?, ?, ?, ?, ?)`,
        )
        stored.forEach((part, seq) => insert.run(id, seq, part.kind, part.content, part.size, part.type, part.spool))
        this.db
          .prepare(`UPDATE runs SET delivery = 'pending', delivery_error = NULL, delivered_at = NULL WHERE id = ?`)
          .run(runId)
        return id
      })()
    } catch (error) {
      for (const name of spooled) this.spool.remove(name)
      throw error
    }
  }

  /** A file part's bytes from the spool, exactly as the run left them; a reason when they are not there. */
  readFile(part: SpooledFile): {file: OutboundFile} | {problem: string} {
    const read = this.spool.read(part.spool, part.size)
    if ('problem' in read) return read
    return {file: {name: part.name, size: part.size, content_type: part.contentType, data: read.data}}
  }

  /** Bytes of the files replies still owe, kept in the spool. */
  spooledBytes(): number {
    return this.db
      .prepare('SELECT coalesce(sum(file_size), 0) FROM outbox_parts WHERE spool IS NOT NULL')
      .pluck()
      .get() as number
  }

  /** Removes spool entries no reply still owes (at start: what a crash or a finished reply left). */
  sweepSpool(): number {
    const owed = this.db.prepare('SELECT spool FROM outbox_parts WHERE spool IS NOT NULL').pluck().all() as string[]
    return this.spool.sweep(new Set(owed))
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
    const row = this.db
      .prepare(
        `SELECT seq, kind, content, file_size, content_type, spool FROM outbox_parts
         WHERE reply_id = ? AND sent_at IS NULL ORDER BY seq LIMIT 1`,
      )
      .get(replyId) as PartRow | undefined
    if (!row) return undefined
    if (row.kind === 'text') return {seq: row.seq, kind: 'text', content: row.content}
    return {
      seq: row.seq,
      kind: 'file',
      name: row.content,
      size: row.file_size ?? 0,
      contentType: row.content_type ?? 'application/octet-stream',
      spool: row.spool ?? '',
    }
  }

  /** How many of a reply's parts went out already. */
  sentParts(replyId: number): number {
    return (
      this.db
        .prepare('SELECT count(*) AS n FROM outbox_parts WHERE reply_id = ? AND sent_at IS NOT NULL')
        .get(replyId) as {n: number}
    ).n
  }

  /** The platform took the part: marked sent, and a file's spooled copy is removed. */
  partSent(replyId: number, part: PendingPart): void {
    this.db
      .prepare('UPDATE outbox_parts SET sent_at = ?, spool = NULL WHERE reply_id = ? AND seq = ?')
      .run(Date.now(), replyId, part.seq)
    if (part.kind === 'file') this.spool.remove(part.spool)
  }

  /**
   * A file the platform (or the spool) could not give the user, for good: the part is done, its
   * run's record says why, and the reply's text ends with a note naming it: added to the last
   * text part not yet sent when it fits in `messageLimit`, else as a part of its own at the end.
   */
  fileRefused(reply: OutboxReply, part: PendingPart & {kind: 'file'}, reason: string, messageLimit: number): void {
    const note = refusalNote([{name: part.name, reason}])
    this.db.transaction(() => {
      this.db
        .prepare('UPDATE outbox_parts SET sent_at = ?, spool = NULL, refused = ? WHERE reply_id = ? AND seq = ?')
        .run(Date.now(), reason, reply.id, part.seq)
      const last = this.db
        .prepare(`SELECT seq, kind, content, sent_at FROM outbox_parts WHERE reply_id = ? ORDER BY seq DESC LIMIT 1`)
        .get(reply.id) as {seq: number; kind: string; content: string; sent_at: number | null}
      if (last.kind === 'text' && last.sent_at === null && last.content.length + note.length <= messageLimit)
        this.db
          .prepare('UPDATE outbox_parts SET content = ? WHERE reply_id = ? AND seq = ?')
          .run(last.content + note, reply.id, last.seq)
      else
        this.db
          .prepare(`INSERT INTO outbox_parts (reply_id, seq, kind, content) VALUES (?, ?, 'text', ?)`)
          .run(reply.id, last.seq + 1, note.trimStart())
      this.fileNotSent(reply.runId, part.name, reason)
    })()
    this.spool.remove(part.spool)
  }

  /** A failed attempt that will be retried: kept for the operator (and the next gateway). */
  attemptFailed(replyId: number, error: string): void {
    this.db.prepare('UPDATE outbox SET attempts = attempts + 1, last_error = ? WHERE id = ?').run(error, replyId)
  }

  /**
   * The reply leaves the outbox; its run record says how it ended (a file given up on with it
   * too), and the spooled copies of its files go.
   */
  finish(reply: OutboxReply, outcome: DeliveryOutcome): void {
    const files = this.db
      .prepare(`SELECT content AS name, spool FROM outbox_parts WHERE reply_id = ? AND spool IS NOT NULL`)
      .all(reply.id) as Array<{name: string; spool: string}>
    this.db.transaction(() => {
      if ('undeliverable' in outcome)
        for (const {name} of files) this.fileNotSent(reply.runId, name, `not delivered: ${outcome.undeliverable}`)
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
    for (const {spool} of files) this.spool.remove(spool)
  }

  /** The run's record of an outbound file it listed as sent now says why it was not (the first such row of that name). */
  private fileNotSent(runId: string, name: string, reason: string): void {
    this.db
      .prepare(
        `UPDATE run_files SET skipped_reason = ? WHERE rowid = (SELECT rowid FROM run_files
         WHERE run_id = ? AND direction = 'out' AND name = ? AND skipped_reason IS NULL ORDER BY rowid LIMIT 1)`,
      )
      .run(reason, runId, name)
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
