import crypto from 'node:crypto'
import type {GatewayDb} from '../state/gateway-db.js'
import {hashRandomToken} from '../state/token-hash.js'

/** How long a dashboard login lasts without being used again. */
export const SESSION_TTL_MS = 7 * 24 * 60 * 60 * 1000
/** How long a `meepagateway dashboard link` URL can be used (once). */
export const LOGIN_LINK_TTL_MS = 10 * 60 * 1000
/** Dashboard session tokens start with this; API keys with cptn_. */
export const SESSION_TOKEN_PREFIX = 'cps_'

export interface Session {
  createdAt: number
  expiresAt: number
}

/**
 * The dashboard's persistent state in gateway.db: the password hash, the login sessions and the
 * one-time login links. Session tokens and link secrets are 32 random bytes stored only as a
 * SHA-256, like API keys: a copy of the database does not let anyone log in.
 */
export class CaptainAuthStore {
  constructor(private readonly db: GatewayDb) {}

  passwordHash(): string | undefined {
    const row = this.db.prepare("SELECT value FROM captain_settings WHERE key = 'password_hash'").get() as
      {value: string} | undefined
    return row?.value
  }

  /** Sets the password hash and ends every session (a changed password logs everyone out). */
  setPasswordHash(hash: string): void {
    this.db.transaction(() => {
      this.db
        .prepare(
          "INSERT INTO captain_settings (key, value, updated_at) VALUES ('password_hash', ?, ?) ON CONFLICT(key) DO UPDATE SET value = excluded.value, updated_at = excluded.updated_at",
        )
        .run(hash, Date.now())
      this.db.prepare('DELETE FROM captain_sessions').run()
    })()
  }

  createSession(now = Date.now()): {token: string; session: Session} {
    const token = SESSION_TOKEN_PREFIX + crypto.randomBytes(32).toString('base64url')
    const session: Session = {createdAt: now, expiresAt: now + SESSION_TTL_MS}
    this.db.prepare('DELETE FROM captain_sessions WHERE expires_at <= ?').run(now)
    // csrf_token is a column of the first schema; sessions are bearer tokens now and need none
    this.db
      .prepare(
        "INSERT INTO captain_sessions (token_hash, csrf_token, created_at, expires_at, last_seen_at) VALUES (?, '', ?, ?, ?)",
      )
      .run(hashRandomToken(token), session.createdAt, session.expiresAt, now)
    return {token, session}
  }

  /** The live session of a token; using a session extends it (sliding expiry, written at most once a minute). */
  findSession(token: string, now = Date.now()): Session | undefined {
    if (!token.startsWith(SESSION_TOKEN_PREFIX)) return undefined
    const row = this.db
      .prepare('SELECT created_at, expires_at, last_seen_at FROM captain_sessions WHERE token_hash = ?')
      .get(hashRandomToken(token)) as {created_at: number; expires_at: number; last_seen_at: number} | undefined
    if (!row || row.expires_at <= now) return undefined
    let expiresAt = row.expires_at
    if (now - row.last_seen_at > 60_000) {
      expiresAt = now + SESSION_TTL_MS
      this.db
        .prepare('UPDATE captain_sessions SET last_seen_at = ?, expires_at = ? WHERE token_hash = ?')
        .run(now, expiresAt, hashRandomToken(token))
    }
    return {createdAt: row.created_at, expiresAt}
  }

  deleteSession(token: string): void {
    this.db.prepare('DELETE FROM captain_sessions WHERE token_hash = ?').run(hashRandomToken(token))
  }

  /** A one-time login secret (for `meepagateway dashboard link`); only its hash is stored. */
  createLoginLink(now = Date.now()): string {
    const secret = crypto.randomBytes(32).toString('base64url')
    this.db.prepare('DELETE FROM captain_login_links WHERE expires_at <= ?').run(now)
    this.db
      .prepare('INSERT INTO captain_login_links (token_hash, created_at, expires_at) VALUES (?, ?, ?)')
      .run(hashRandomToken(secret), now, now + LOGIN_LINK_TTL_MS)
    return secret
  }

  /** True once per live link secret: using it deletes it. */
  consumeLoginLink(secret: string, now = Date.now()): boolean {
    const row = this.db
      .prepare('DELETE FROM captain_login_links WHERE token_hash = ? RETURNING expires_at')
      .get(hashRandomToken(secret)) as {expires_at: number} | undefined
    return row !== undefined && row.expires_at > now
  }
}
