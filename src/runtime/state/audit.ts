import {GatewayError} from '../util/errors.js'
import {withGatewayDb, type GatewayDb} from './gateway-db.js'

export type AuditLevel = 'info' | 'warning'

export interface AuditEntry {
  event: string
  /** Who did it: `dashboard`, `key_… (name)`, `anonymous`, `cli`. */
  principal: string
  summary: string
  /** Warning: the change weakens isolation or the dashboard's protection. */
  level?: AuditLevel
  source?: string
  details?: Record<string, unknown>
}

export interface AuditRecord {
  id: number
  at: number
  level: AuditLevel
  event: string
  principal: string
  source: string | null
  summary: string
  details: Record<string, unknown> | null
}

/**
 * The operator's record of who changed what: logins that failed, passwords, keys and every config
 * change made through the API. Written to gateway.db (which a sandboxed agent cannot read or
 * write) and, while serving, to the gateway's log.
 */
export class AuditLog {
  constructor(
    private readonly db: GatewayDb,
    private readonly log?: (line: string) => void,
  ) {}

  record(entry: AuditEntry, now = Date.now()): void {
    const level = entry.level ?? 'info'
    this.db
      .prepare('INSERT INTO audit (at, level, event, principal, source, summary, details) VALUES (?, ?, ?, ?, ?, ?, ?)')
      .run(
        now,
        level,
        entry.event,
        entry.principal,
        entry.source ?? null,
        entry.summary,
        entry.details ? JSON.stringify(entry.details) : null,
      )
    const line = `audit${level === 'warning' ? ' WARNING' : ''}: ${entry.summary} (by ${entry.principal}${entry.source ? ` from ${entry.source}` : ''})`
    // one entry, one line: a name with a line break must not print a second, forged entry
    this.log?.(line.replace(/\p{Cc}/gu, (char) => JSON.stringify(char).slice(1, -1)))
  }

  /** Oldest first, from `since` (ms since epoch) on. */
  list(options: {since?: number; limit?: number} = {}): AuditRecord[] {
    const rows = this.db
      .prepare('SELECT * FROM (SELECT * FROM audit WHERE at >= ? ORDER BY id DESC LIMIT ?) ORDER BY id ASC')
      .all(options.since ?? 0, options.limit ?? 1000) as Array<Omit<AuditRecord, 'details'> & {details: string | null}>
    return rows.map((row) => ({
      ...row,
      details: row.details ? (JSON.parse(row.details) as Record<string, unknown>) : null,
    }))
  }
}

/** `meepagateway audit`: the audit log, oldest first. */
export function listAudit(options: {home: string; since?: number; limit?: number}): AuditRecord[] {
  return withGatewayDb(options.home, (db) => new AuditLog(db).list(options))
}

/** `--since`: an ISO date/time, or a duration back from now (`30m`, `24h`, `7d`). */
export function parseSince(text: string, now = Date.now()): number {
  const duration = /^(\d+)\s*([smhd])$/i.exec(text.trim())
  if (duration) {
    const unit = {s: 1000, m: 60_000, h: 3_600_000, d: 86_400_000}[duration[2]!.toLowerCase() as 's' | 'm' | 'h' | 'd']
    return now - Number(duration[1]) * unit
  }
  const time = Date.parse(text)
  if (Number.isNaN(time)) {
    throw new GatewayError('E_USAGE', `--since ${JSON.stringify(text)} is neither a date nor a duration`, {
      suggestions: ['--since 24h', '--since 2026-01-01T00:00:00Z'],
    })
  }
  return time
}
