import crypto from 'node:crypto'
import {GatewayError} from '../util/errors.js'
import {AuditLog} from './audit.js'
import {withGatewayDb, type GatewayDb} from './gateway-db.js'
import {hashRandomToken} from './token-hash.js'

export const API_KEY_PREFIX = 'cptn_'
/** Characters of the key kept in clear (prefix + a few random ones) so keys can be told apart. */
const SHOWN_PREFIX_LENGTH = API_KEY_PREFIX.length + 6

/**
 * A chat key may only chat (POST /api/chat) and read its own conversations; an admin key may do
 * what the dashboard does.
 */
export type ApiKeyKind = 'chat' | 'admin'

export interface ApiKeyInfo {
  id: string
  name: string
  kind: ApiKeyKind
  key_prefix: string
  created_at: number
  last_used_at: number | null
  revoked_at: number | null
}

export interface CreatedApiKey {
  id: string
  name: string
  kind: ApiKeyKind
  /** The only time the whole key exists outside its holder: it is not stored. */
  key: string
}

export class ApiKeys {
  constructor(private readonly db: GatewayDb) {}

  create(name: string, kind: ApiKeyKind = 'chat'): CreatedApiKey {
    const trimmed = name.trim()
    // the name appears in the audit log and serve's log: a line break there could forge entries
    if (!trimmed || trimmed.length > 100 || /\p{Cc}/u.test(trimmed)) {
      throw new GatewayError(
        'E_USAGE',
        'an API key name must be 1 to 100 characters, without control characters (line breaks, tabs)',
        {
          suggestions: ['meepagateway api-key create "deploy script"'],
        },
      )
    }
    const id = `key_${crypto.randomBytes(6).toString('hex')}`
    const key = API_KEY_PREFIX + crypto.randomBytes(32).toString('base64url')
    this.db
      .prepare('INSERT INTO api_keys (id, name, kind, key_hash, key_prefix, created_at) VALUES (?, ?, ?, ?, ?, ?)')
      .run(id, trimmed, kind, hashRandomToken(key), key.slice(0, SHOWN_PREFIX_LENGTH), Date.now())
    return {id, name: trimmed, kind, key}
  }

  list(): ApiKeyInfo[] {
    return this.db
      .prepare(
        'SELECT id, name, kind, key_prefix, created_at, last_used_at, revoked_at FROM api_keys ORDER BY created_at, rowid',
      )
      .all() as ApiKeyInfo[]
  }

  /** Revoking twice is not an error; an unknown id is. */
  revoke(id: string): ApiKeyInfo {
    const row = this.db.prepare('SELECT id FROM api_keys WHERE id = ?').get(id)
    if (!row) {
      throw new GatewayError('E_NOT_FOUND', `no API key with id ${id}`, {suggestions: ['meepagateway api-key list']})
    }
    this.db.prepare('UPDATE api_keys SET revoked_at = COALESCE(revoked_at, ?) WHERE id = ?').run(Date.now(), id)
    return this.db
      .prepare('SELECT id, name, kind, key_prefix, created_at, last_used_at, revoked_at FROM api_keys WHERE id = ?')
      .get(id) as ApiKeyInfo
  }

  /** The key's record when it is known and not revoked, else undefined. */
  verify(key: string): ApiKeyInfo | undefined {
    if (!key.startsWith(API_KEY_PREFIX)) return undefined
    const row = this.db
      .prepare(
        'SELECT id, name, kind, key_prefix, created_at, last_used_at, revoked_at FROM api_keys WHERE key_hash = ?',
      )
      .get(hashRandomToken(key)) as ApiKeyInfo | undefined
    if (!row || row.revoked_at !== null) return undefined
    const now = Date.now()
    // last_used_at is informational: write it at most once a minute to keep hot paths read-only
    if (row.last_used_at === null || now - row.last_used_at > 60_000) {
      this.db.prepare('UPDATE api_keys SET last_used_at = ? WHERE id = ?').run(now, row.id)
    }
    return row
  }
}

/** `meepagateway api-key create|list|revoke`: one-shot operations on the gateway database. */
export function createApiKey(options: {home: string; name: string; admin?: boolean}): CreatedApiKey {
  return withGatewayDb(options.home, (db) => {
    const created = new ApiKeys(db).create(options.name, options.admin ? 'admin' : 'chat')
    new AuditLog(db).record({
      event: 'api_key_created',
      principal: 'cli',
      summary: `${created.kind} key ${created.id} (${created.name}) created`,
      details: {id: created.id, kind: created.kind},
    })
    return created
  })
}

export function listApiKeys(options: {home: string}): ApiKeyInfo[] {
  return withGatewayDb(options.home, (db) => new ApiKeys(db).list())
}

export function revokeApiKey(options: {home: string; id: string}): ApiKeyInfo {
  return withGatewayDb(options.home, (db) => {
    const revoked = new ApiKeys(db).revoke(options.id)
    new AuditLog(db).record({
      event: 'api_key_revoked',
      principal: 'cli',
      summary: `${revoked.kind} key ${revoked.id} (${revoked.name}) revoked`,
      details: {id: revoked.id},
    })
    return revoked
  })
}

/**
 * Keys made before keys had kinds became chat keys (gateway.db migration); the first `serve`
 * after it says so, once.
 */
export function takeLegacyKeysNotice(db: GatewayDb): string | undefined {
  const row = db.prepare("DELETE FROM captain_settings WHERE key = 'legacy_keys_notice' RETURNING value").get() as
    {value: string} | undefined
  if (!row) return undefined
  return (
    `gateway: the ${row.value} API key(s) created before keys had kinds are now CHAT keys (POST /api/chat only); ` +
    'create an admin key with `meepagateway api-key create NAME --admin` for scripts that manage the gateway'
  )
}
