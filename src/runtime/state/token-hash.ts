import crypto from 'node:crypto'

/**
 * How API keys and dashboard session tokens are stored. Both are 32 random bytes, so a plain
 * SHA-256 suffices: there is nothing to brute-force, and checking one is a single indexed lookup.
 * A copy of gateway.db therefore lets no one in.
 */
export function hashRandomToken(token: string): string {
  return crypto.createHash('sha256').update(token, 'utf8').digest('hex')
}
