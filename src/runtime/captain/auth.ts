import crypto from 'node:crypto'
import type {IncomingMessage} from 'node:http'
import {bearerToken} from '../http/json.js'
import {HttpError} from '../http/router.js'
import type {ApiKeys} from '../state/api-keys.js'
import type {AuditEntry, AuditLog} from '../state/audit.js'
import {CaptainAuthStore, SESSION_TOKEN_PREFIX} from './auth-store.js'
import {hashPassword, passwordProblem, sameSecret, verifyPassword} from './passwords.js'
import {PasswordGuard} from './rate-limit.js'

export const PASSWORD_ENV = 'MEEPAGATEWAY_PASSWORD'

/**
 * Who made a request. Only an `Authorization: Bearer` header proves anything: cookies and HTTP
 * auth are attached by browsers on their own (to every port of 127.0.0.1), so they are ignored.
 */
export type Principal =
  {kind: 'session'; token: string} | {kind: 'api-key'; keyId: string; name: string; admin: boolean}

/**
 * What a route needs: `admin` (a dashboard session or an admin key), `session` (the dashboard,
 * logged in with the password: password changes) or `chat` (any valid credential: web chat).
 */
export type Need = 'admin' | 'session' | 'chat'

export function principalLabel(principal: Principal): string {
  return principal.kind === 'session'
    ? 'dashboard'
    : `${principal.admin ? 'admin' : 'chat'} key ${principal.keyId} (${principal.name})`
}

export function clientOf(req: IncomingMessage): string {
  return req.socket.remoteAddress ?? 'unknown'
}

export interface CaptainAuthOptions {
  env?: NodeJS.ProcessEnv
  log: (line: string) => void
  audit: AuditLog
  guard?: PasswordGuard
}

/** Unambiguous characters for a code read off a terminal (no 0/O, 1/I/L). */
const CODE_ALPHABET = 'ABCDEFGHJKMNPQRSTUVWXYZ23456789'

/**
 * Dashboard authentication: a password (from MEEPAGATEWAY_PASSWORD, or set once in the browser
 * with a setup code printed to the terminal) or a one-time link from `meepagateway dashboard link`
 * gives a session token that the dashboard page keeps in its own (per-origin, so per-port)
 * sessionStorage and sends as `Authorization: Bearer`; scripts send API keys the same way.
 */
export class CaptainAuth {
  private setupCode: string | undefined
  /** Checks run one at a time: each scrypt takes 32 MB, so parallel guesses must not add up. */
  private checking: Promise<unknown> = Promise.resolve()
  /** Unlimited kinds of failure (refused attempts, bad links) go on the record at most once a minute, with a count. */
  private readonly throttled = new Map<string, {count: number; lastRecordedAt: number}>()
  private readonly guard: PasswordGuard
  private readonly env: NodeJS.ProcessEnv

  constructor(
    private readonly store: CaptainAuthStore,
    private readonly apiKeys: ApiKeys,
    private readonly options: CaptainAuthOptions,
  ) {
    this.env = options.env ?? process.env
    this.guard = options.guard ?? new PasswordGuard()
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
      if (passwordProblem(fromEnv))
        this.options.log(`captain: ${PASSWORD_ENV} is shorter than 8 characters; choose a longer password`)
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

  async login(req: IncomingMessage, password: unknown): Promise<string> {
    const stored = this.store.passwordHash()
    if (!stored)
      throw new HttpError(
        409,
        'E_AUTH',
        'no dashboard password is set yet; use the setup code printed by `meepagateway serve`',
      )
    await this.checkSecret(
      req,
      'login_failed',
      'dashboard login with a wrong password',
      () => typeof password === 'string' && verifyPassword(password, stored),
    )
    return this.store.createSession().token
  }

  /** First-time setup: the code from the terminal sets the password, once. */
  async setup(req: IncomingMessage, code: unknown, password: unknown): Promise<string> {
    if (this.passwordSet || !this.setupCode)
      throw new HttpError(409, 'E_AUTH', 'the dashboard password is already set; log in instead')
    const setupCode = this.setupCode
    await this.checkSecret(
      req,
      'setup_failed',
      'dashboard setup with a wrong setup code',
      () => typeof code === 'string' && sameSecret(normalizeCode(code), setupCode),
    )
    const problem = passwordProblem(password)
    if (problem) throw new HttpError(400, 'E_INPUT', problem)
    if (this.passwordSet) throw new HttpError(409, 'E_AUTH', 'the dashboard password is already set; log in instead')
    this.store.setPasswordHash(await hashPassword(password as string))
    this.setupCode = undefined
    this.options.audit.record({
      event: 'password_set',
      principal: 'setup code',
      source: clientOf(req),
      summary: 'dashboard password set through the setup page',
    })
    return this.store.createSession().token
  }

  /** Needs the dashboard (never a key) and the current password; answers with this browser's fresh session. */
  async changePassword(req: IncomingMessage, current: unknown, next: unknown): Promise<string> {
    if (this.passwordFromEnv) {
      throw new HttpError(
        409,
        'E_AUTH',
        `the password comes from ${PASSWORD_ENV}; change that variable and restart the gateway`,
      )
    }
    const problem = passwordProblem(next)
    if (problem) throw new HttpError(400, 'E_INPUT', problem.replace('"password"', '"new_password"'))
    const stored = this.store.passwordHash()
    await this.checkSecret(
      req,
      'password_change_failed',
      'password change with a wrong current password',
      async () => Boolean(stored) && typeof current === 'string' && (await verifyPassword(current, stored as string)),
    )
    this.store.setPasswordHash(await hashPassword(next as string))
    this.options.audit.record({
      event: 'password_changed',
      principal: 'dashboard',
      source: clientOf(req),
      summary: 'dashboard password changed; every session ended',
    })
    return this.store.createSession().token
  }

  /** A one-time link from `meepagateway dashboard link`: not rate-limited (the secret is 256 random bits). */
  loginWithLink(req: IncomingMessage, secret: unknown): string {
    if (typeof secret !== 'string' || !this.store.consumeLoginLink(secret)) {
      this.recordThrottled('link failed', {
        event: 'login_failed',
        principal: 'anonymous',
        source: clientOf(req),
        summary: 'dashboard login with an unknown, used or expired link',
      })
      throw new HttpError(
        401,
        'E_AUTH',
        'this login link is unknown, used or expired; run `meepagateway dashboard link` for a new one',
      )
    }
    this.options.audit.record({
      event: 'login_link_used',
      principal: 'dashboard link',
      source: clientOf(req),
      summary: 'dashboard login with a one-time link',
    })
    return this.store.createSession().token
  }

  /** Whether the request carries a live dashboard session. */
  hasSession(req: IncomingMessage): boolean {
    const token = bearerToken(req)
    return token !== undefined && this.store.findSession(token) !== undefined
  }

  logout(req: IncomingMessage): void {
    const token = bearerToken(req)
    if (token?.startsWith(SESSION_TOKEN_PREFIX)) this.store.deleteSession(token)
  }

  /** Who is calling: 401 without a valid bearer credential, 403 when it is not enough for `need`. */
  authenticate(req: IncomingMessage, need: Need = 'admin'): Principal {
    const token = bearerToken(req)
    const challenge = {'www-authenticate': 'Bearer realm="meepagateway"'}
    if (token === undefined) {
      throw new HttpError(
        401,
        'E_AUTH',
        'log in to the dashboard, or send an API key as Authorization: Bearer cptn_... (cookies are not accepted)',
        challenge,
      )
    }
    let principal: Principal
    if (token.startsWith(SESSION_TOKEN_PREFIX)) {
      if (!this.store.findSession(token))
        throw new HttpError(401, 'E_AUTH', 'the dashboard session ended; log in again', challenge)
      principal = {kind: 'session', token}
    } else {
      const record = this.apiKeys.verify(token)
      if (!record) throw new HttpError(401, 'E_AUTH', 'unknown or revoked API key', challenge)
      principal = {kind: 'api-key', keyId: record.id, name: record.name, admin: record.kind === 'admin'}
    }
    if (need === 'session' && principal.kind !== 'session') {
      throw new HttpError(
        403,
        'E_AUTH',
        'only the dashboard, logged in with the password, may do this; API keys may not',
      )
    }
    if (need === 'admin' && principal.kind === 'api-key' && !principal.admin) {
      throw new HttpError(
        403,
        'E_AUTH',
        `${principal.keyId} is a chat key: it may only use POST /api/chat and read its own conversations`,
        {},
      )
    }
    return principal
  }

  /** A flood of these must not flood the log or gateway.db: one entry a minute says how many there were. */
  private recordThrottled(key: string, entry: AuditEntry): void {
    const state = this.throttled.get(key) ?? {count: 0, lastRecordedAt: 0}
    state.count++
    this.throttled.set(key, state)
    if (Date.now() - state.lastRecordedAt < 60_000) return
    this.options.audit.record({
      ...entry,
      summary: `${entry.summary} (${state.count} time(s) since the last such entry)`,
    })
    this.throttled.set(key, {count: 0, lastRecordedAt: Date.now()})
  }

  /** Counts the attempt first (429 when over a limit), then checks; a wrong secret is audited and answers 401. */
  private async checkSecret(
    req: IncomingMessage,
    event: string,
    what: string,
    check: () => boolean | Promise<boolean>,
  ): Promise<void> {
    const source = clientOf(req)
    const ticket = this.guard.begin(source)
    if (!ticket.ok) {
      this.recordThrottled(`${event} refused`, {
        event,
        principal: 'anonymous',
        source,
        summary: `${what} refused: too many attempts`,
      })
      throw new HttpError(
        429,
        'E_AUTH',
        `too many attempts; try again in ${ticket.retryAfterSeconds} s, or run \`meepagateway dashboard link\` on this machine`,
        {
          'retry-after': String(ticket.retryAfterSeconds),
        },
      )
    }
    const checked = this.checking.then(check)
    this.checking = checked.catch(() => undefined)
    if (!(await checked)) {
      this.options.audit.record({event, principal: 'anonymous', source, summary: what})
      throw new HttpError(
        401,
        'E_AUTH',
        event === 'setup_failed'
          ? 'wrong setup code; it is printed in the terminal running `meepagateway serve`'
          : event === 'login_failed'
            ? 'wrong password'
            : 'the current password is wrong',
      )
    }
    ticket.succeeded()
  }
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
