import crypto from 'node:crypto'
import type {IncomingMessage, ServerResponse} from 'node:http'
import {bearerToken} from '../http/json.js'
import {HttpError} from '../http/router.js'
import type {ApiKeys} from '../state/api-keys.js'
import {CaptainAuthStore, SESSION_TTL_MS} from './auth-store.js'
import {hashPassword, passwordProblem, sameSecret, verifyPassword} from './passwords.js'
import {FailureRateLimiter} from './rate-limit.js'

export const SESSION_COOKIE = 'captain_session'
export const CSRF_HEADER = 'x-csrf-token'
export const PASSWORD_ENV = 'MEEPAGATEWAY_PASSWORD'

/** Who made a dashboard API request. */
export type Principal = {kind: 'session'; csrfToken: string} | {kind: 'api-key'; keyId: string; name: string}

export interface CaptainAuthOptions {
  env?: NodeJS.ProcessEnv
  log: (line: string) => void
  limiter?: FailureRateLimiter
}

/** Unambiguous characters for a code read off a terminal (no 0/O, 1/I/L). */
const CODE_ALPHABET = 'ABCDEFGHJKMNPQRSTUVWXYZ23456789'

/**
 * Dashboard authentication: a password (from MEEPAGATEWAY_PASSWORD, or set once in the browser
 * with a setup code printed to the terminal), session cookies with a CSRF token for browsers,
 * and the gateway's API keys as `Authorization: Bearer` for scripts.
 */
export class CaptainAuth {
  private setupCode: string | undefined
  private readonly store: CaptainAuthStore
  private readonly limiter: FailureRateLimiter
  private readonly env: NodeJS.ProcessEnv

  constructor(
    store: CaptainAuthStore,
    private readonly apiKeys: ApiKeys,
    private readonly options: CaptainAuthOptions,
  ) {
    this.store = store
    this.env = options.env ?? process.env
    this.limiter = options.limiter ?? new FailureRateLimiter()
  }

  /**
   * MEEPAGATEWAY_PASSWORD, when set, is the password: its hash replaces a stored one that does
   * not match (so changing the variable and restarting changes the password). Without it and
   * without a stored hash, a one-time setup code is generated for the terminal.
   */
  async init(): Promise<void> {
    const fromEnv = this.env[PASSWORD_ENV]
    if (fromEnv) {
      const stored = this.store.passwordHash()
      if (!stored || !(await verifyPassword(fromEnv, stored))) this.store.setPasswordHash(await hashPassword(fromEnv))
      if (passwordProblem(fromEnv)) this.options.log(`captain: ${PASSWORD_ENV} is shorter than 8 characters; choose a longer password`)
      return
    }
    if (!this.store.passwordHash()) this.setupCode = newSetupCode()
  }

  get passwordSet(): boolean {
    return this.store.passwordHash() !== undefined
  }

  get passwordFromEnv(): boolean {
    return Boolean(this.env[PASSWORD_ENV])
  }

  /** The setup code while no password is set (print it on the terminal only). */
  get pendingSetupCode(): string | undefined {
    return this.passwordSet ? undefined : this.setupCode
  }

  async login(req: IncomingMessage, password: unknown): Promise<{token: string; csrfToken: string}> {
    const client = clientOf(req)
    this.checkRate(client)
    const stored = this.store.passwordHash()
    if (!stored) throw new HttpError(409, 'E_AUTH', 'no dashboard password is set yet; use the setup code printed by `meepagateway serve`')
    if (typeof password !== 'string' || !(await verifyPassword(password, stored))) {
      this.limiter.recordFailure(client)
      throw new HttpError(401, 'E_AUTH', 'wrong password')
    }
    return this.newSession()
  }

  /** First-time setup: the code from the terminal sets the password, once. */
  async setup(req: IncomingMessage, code: unknown, password: unknown): Promise<{token: string; csrfToken: string}> {
    const client = clientOf(req)
    this.checkRate(client)
    if (this.passwordSet || !this.setupCode) throw new HttpError(409, 'E_AUTH', 'the dashboard password is already set; log in instead')
    if (typeof code !== 'string' || !sameSecret(normalizeCode(code), this.setupCode)) {
      this.limiter.recordFailure(client)
      throw new HttpError(401, 'E_AUTH', 'wrong setup code; it is printed in the terminal running `meepagateway serve`')
    }
    const problem = passwordProblem(password)
    if (problem) throw new HttpError(400, 'E_INPUT', problem)
    this.store.setPasswordHash(await hashPassword(password as string))
    this.setupCode = undefined
    this.options.log('captain: dashboard password set through the setup page')
    return this.newSession()
  }

  async changePassword(current: unknown, next: unknown): Promise<void> {
    if (this.passwordFromEnv) {
      throw new HttpError(409, 'E_AUTH', `the password comes from ${PASSWORD_ENV}; change that variable and restart the gateway`)
    }
    const stored = this.store.passwordHash()
    if (!stored || typeof current !== 'string' || !(await verifyPassword(current, stored))) {
      throw new HttpError(401, 'E_AUTH', 'the current password is wrong')
    }
    const problem = passwordProblem(next)
    if (problem) throw new HttpError(400, 'E_INPUT', problem.replace('"password"', '"new_password"'))
    this.store.setPasswordHash(await hashPassword(next as string))
  }

  /** The session of the request's cookie, if it is live. */
  session(req: IncomingMessage): {token: string; csrfToken: string} | undefined {
    const token = readCookie(req, SESSION_COOKIE)
    if (!token) return undefined
    const session = this.store.findSession(token)
    return session ? {token, csrfToken: session.csrfToken} : undefined
  }

  logout(req: IncomingMessage): void {
    const token = readCookie(req, SESSION_COOKIE)
    if (token) this.store.deleteSession(token)
  }

  /**
   * Who is calling, or 401. A bearer key is checked first and, when present, is the only
   * credential considered. Cookie-authenticated requests that change state must carry the
   * session's CSRF token in X-CSRF-Token: another site can make a browser send the cookie, but
   * cannot read the token.
   */
  authenticate(req: IncomingMessage): Principal {
    const key = bearerToken(req)
    if (key !== undefined || req.headers.authorization) {
      const record = key ? this.apiKeys.verify(key) : undefined
      if (!record) throw new HttpError(401, 'E_AUTH', 'unknown or revoked API key', {'www-authenticate': 'Bearer realm="meepagateway"'})
      return {kind: 'api-key', keyId: record.id, name: record.name}
    }
    const session = this.session(req)
    if (!session) throw new HttpError(401, 'E_AUTH', 'log in to the dashboard first (or send an API key as Authorization: Bearer cptn_...)')
    if (!SAFE_METHODS.has((req.method ?? 'GET').toUpperCase())) {
      const sent = req.headers[CSRF_HEADER]
      if (typeof sent !== 'string' || !sameSecret(sent, session.csrfToken)) {
        throw new HttpError(403, 'E_AUTH', `missing or wrong CSRF token: send the token from GET /api/captain/auth/session in the ${CSRF_HEADER} header`)
      }
    }
    return {kind: 'session', csrfToken: session.csrfToken}
  }

  setSessionCookie(res: ServerResponse, token: string): void {
    res.setHeader('set-cookie', `${SESSION_COOKIE}=${token}; Path=/; HttpOnly; SameSite=Strict; Max-Age=${SESSION_TTL_MS / 1000}`)
  }

  clearSessionCookie(res: ServerResponse): void {
    res.setHeader('set-cookie', `${SESSION_COOKIE}=; Path=/; HttpOnly; SameSite=Strict; Max-Age=0`)
  }

  private newSession(): {token: string; csrfToken: string} {
    const {token, session} = this.store.createSession()
    return {token, csrfToken: session.csrfToken}
  }

  private checkRate(client: string): void {
    const wait = this.limiter.retryAfterSeconds(client)
    if (wait > 0) throw new HttpError(429, 'E_AUTH', `too many failed attempts; try again in ${wait} s`, {'retry-after': String(wait)})
  }
}

const SAFE_METHODS = new Set(['GET', 'HEAD', 'OPTIONS'])

function clientOf(req: IncomingMessage): string {
  return req.socket.remoteAddress ?? 'unknown'
}

export function readCookie(req: IncomingMessage, name: string): string | undefined {
  const header = req.headers.cookie
  if (!header) return undefined
  for (const part of header.split(';')) {
    const index = part.indexOf('=')
    if (index > 0 && part.slice(0, index).trim() === name) return part.slice(index + 1).trim() || undefined
  }
  return undefined
}

function newSetupCode(): string {
  const bytes = crypto.randomBytes(9)
  const chars = [...bytes].map((byte) => CODE_ALPHABET[byte % CODE_ALPHABET.length])
  return `${chars.slice(0, 3).join('')}-${chars.slice(3, 6).join('')}-${chars.slice(6).join('')}`
}

/** Codes are typed by hand: case and separators do not matter. */
function normalizeCode(code: string): string {
  const compact = code.toUpperCase().replace(/[^A-Z0-9]/g, '')
  return `${compact.slice(0, 3)}-${compact.slice(3, 6)}-${compact.slice(6)}`
}
