import crypto from 'node:crypto'
import type {GatewayDb} from '../state/gateway-db.js'
import {hashRandomToken} from '../state/token-hash.js'

/** How long a dashboard login lasts without being used again. */
export const SESSION_TTL_MS = 7 * 24 * 60 * 60 * 1000

export interface Session {
  csrfToken: string
  createdAt: number
  expiresAt: number
}

/**
 * The dashboard's persistent state in gateway.db: the password hash and the login sessions.
 * Session cookies are 32 random bytes stored only as a SHA-256, like API keys: a copy of the
 * database does not let anyone log in.
 */
export class CaptainAuthStore {
  constructor(private readonly db: GatewayDb) {}

  passwordHash(): string | undefined {
    const row = this.db.prepare("SELECT value FROM captain_settings WHERE key = 'password_hash'").get() as {value: string} | undefined
    return row?.value
  }

  /** Sets the password hash and ends every session (a changed password logs everyone out). */
  setPasswordHash(hash: string): void {
    this.db.transaction(() => {
      this.db
        .prepare("INSERT INTO captain_settings (key, value, updated_at) VALUES ('password_hash', ?, ?) ON CONFLICT(key) DO UPDATE SET value = excluded.value, updated_at = excluded.updated_at")
        .run(hash, Date.now())
      this.db.prepare('DELETE FROM captain_sessions').run()
    })()
  }

  createSession(now = Date.now()): {token: string; session: Session} {
    const token = crypto.randomBytes(32).toString('base64url')
    const session: Session = {csrfToken: crypto.randomBytes(24).toString('base64url'), createdAt: now, expiresAt: now + SESSION_TTL_MS}
    this.db.prepare('DELETE FROM captain_sessions WHERE expires_at <= ?').run(now)
    this.db
      .prepare('INSERT INTO captain_sessions (token_hash, csrf_token, created_at, expires_at, last_seen_at) VALUES (?, ?, ?, ?, ?)')
      .run(hashRandomToken(token), session.csrfToken, session.createdAt, session.expiresAt, now)
    return {token, session}
  }

  /** The live session of a cookie value; using a session extends it (sliding expiry, written at most once a minute). */
  findSession(token: string, now = Date.now()): Session | undefined {
    const row = this.db
      .prepare('SELECT csrf_token, created_at, expires_at, last_seen_at FROM captain_sessions WHERE token_hash = ?')
      .get(hashRandomToken(token)) as {csrf_token: string; created_at: number; expires_at: number; last_seen_at: number} | undefined
    if (!row || row.expires_at <= now) return undefined
    let expiresAt = row.expires_at
    if (now - row.last_seen_at > 60_000) {
      expiresAt = now + SESSION_TTL_MS
      this.db.prepare('UPDATE captain_sessions SET last_seen_at = ?, expires_at = ? WHERE token_hash = ?').run(now, expiresAt, hashRandomToken(token))
    }
    return {csrfToken: row.csrf_token, createdAt: row.created_at, expiresAt}
  }

  deleteSession(token: string): void {
    this.db.prepare('DELETE FROM captain_sessions WHERE token_hash = ?').run(hashRandomToken(token))
  }
}
