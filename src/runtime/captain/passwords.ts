import crypto from 'node:crypto'
import {promisify} from 'node:util'

const scrypt = promisify(crypto.scrypt) as (
  password: string,
  salt: Buffer,
  keylen: number,
  options: crypto.ScryptOptions,
) => Promise<Buffer>

/** scrypt cost: N=2^15, r=8 takes ~50-100 ms and 32 MB per guess, which is what makes a stolen hash slow to attack. */
const COST = {N: 2 ** 15, r: 8, p: 1}
const KEY_LENGTH = 32
const SALT_LENGTH = 16
/** Dashboard passwords shorter than this are refused: the dashboard can run agents unrestricted. */
export const MIN_PASSWORD_LENGTH = 8

/** `scrypt$N$r$p$salt$hash` (base64url): self-describing, so the cost can rise later without breaking old hashes. */
export async function hashPassword(password: string): Promise<string> {
  const salt = crypto.randomBytes(SALT_LENGTH)
  const key = await scrypt(password.normalize('NFC'), salt, KEY_LENGTH, {...COST, maxmem: 128 * COST.N * COST.r * 2})
  return ['scrypt', COST.N, COST.r, COST.p, salt.toString('base64url'), key.toString('base64url')].join('$')
}

export async function verifyPassword(password: string, stored: string): Promise<boolean> {
  const [scheme, n, r, p, salt, expected] = stored.split('$')
  if (scheme !== 'scrypt' || !salt || !expected) return false
  const cost = {N: Number(n), r: Number(r), p: Number(p)}
  if (![cost.N, cost.r, cost.p].every(Number.isSafeInteger)) return false
  const expectedKey = Buffer.from(expected, 'base64url')
  const key = await scrypt(password.normalize('NFC'), Buffer.from(salt, 'base64url'), expectedKey.length, {
    ...cost,
    maxmem: 128 * cost.N * cost.r * 2,
  })
  return crypto.timingSafeEqual(key, expectedKey)
}

/** Why a new password is not acceptable, or undefined when it is. */
export function passwordProblem(password: unknown): string | undefined {
  if (typeof password !== 'string') return 'field "password" must be a string'
  if (password.length < MIN_PASSWORD_LENGTH) return `the password must be at least ${MIN_PASSWORD_LENGTH} characters`
  if (password.length > 1024) return 'the password must be at most 1024 characters'
  return undefined
}

/** Constant-time comparison of two strings (tokens, codes). */
export function sameSecret(a: string, b: string): boolean {
  const left = crypto.createHash('sha256').update(a).digest()
  const right = crypto.createHash('sha256').update(b).digest()
  return crypto.timingSafeEqual(left, right)
}
