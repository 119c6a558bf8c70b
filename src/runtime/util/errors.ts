/**
 * The one error class of the runtime. Commands map it to a message, "Try this:" suggestions and
 * an exit code; agent-run maps it to the `{ok: false, error}` object of its contract.
 */
export type ErrorCode =
  | 'E_CONFIG'
  | 'E_INPUT'
  | 'E_USAGE'
  | 'E_AGENT_UNKNOWN'
  | 'E_WORKSPACE'
  | 'E_PROVIDER'
  | 'E_TIMEOUT'
  | 'E_OOM'
  | 'E_LIMIT'
  | 'E_DISK'
  | 'E_RUN'
  | 'E_ISOLATION_UNAVAILABLE'
  | 'E_SANDBOX'
  | 'E_DOCKER'
  | 'E_DOCKER_DOWN'
  | 'E_DOCKER_HUNG'
  | 'E_DOCKER_MISSING'
  | 'E_IMAGE'
  | 'E_STATE'
  | 'E_BUSY'
  | 'E_AUTH'
  | 'E_GATEWAY_RUNNING'
  | 'E_NOT_FOUND'
  | 'E_INTERNAL'

/** Exit codes are part of the CLI's interface (cron jobs read them): never renumber. */
export const EXIT_CODES: Record<ErrorCode, number> = {
  E_USAGE: 2,
  E_CONFIG: 3,
  E_INPUT: 3,
  E_AGENT_UNKNOWN: 4,
  E_WORKSPACE: 4,
  E_NOT_FOUND: 4,
  E_STATE: 5,
  E_PROVIDER: 6,
  E_TIMEOUT: 7,
  E_OOM: 7,
  E_LIMIT: 7,
  E_DISK: 7,
  E_RUN: 8,
  E_BUSY: 8,
  E_ISOLATION_UNAVAILABLE: 9,
  E_SANDBOX: 9,
  E_DOCKER: 10,
  E_DOCKER_DOWN: 10,
  E_DOCKER_HUNG: 10,
  E_DOCKER_MISSING: 10,
  E_IMAGE: 10,
  E_AUTH: 11,
  E_GATEWAY_RUNNING: 12,
  E_INTERNAL: 1,
}

export interface GatewayErrorOptions {
  cause?: unknown
  suggestions?: string[]
  retryable?: boolean
  /** Extra machine-readable facts (e.g. the providers that failed, the stderr tail of a run). */
  details?: Record<string, unknown>
  /** Overrides the code's exit status (a `send` stopped by a signal exits with its run's: 130, 143). */
  exitCode?: number
}

/** Marks a GatewayError of any bundle: `send`'s one-shot run is a bundle of its own, with its own copy of the class. */
const GATEWAY_ERROR = Symbol.for('meepagateway.GatewayError')

export class GatewayError extends Error {
  /** `instanceof` holds for a GatewayError made by another bundle's copy of this class. */
  static [Symbol.hasInstance](value: unknown): boolean {
    // a subclass (DockerCommandError) keeps the prototype check
    if (this !== GatewayError) return Function.prototype[Symbol.hasInstance].call(this, value)
    return typeof value === 'object' && value !== null && (value as Record<symbol, unknown>)[GATEWAY_ERROR] === true
  }

  readonly [GATEWAY_ERROR] = true
  readonly code: ErrorCode
  readonly exitCode: number
  readonly suggestions: string[]
  readonly retryable: boolean
  readonly details: Record<string, unknown>

  constructor(code: ErrorCode, message: string, options: GatewayErrorOptions = {}) {
    super(message, options.cause === undefined ? undefined : {cause: options.cause})
    this.name = 'GatewayError'
    this.code = code
    this.exitCode = options.exitCode ?? EXIT_CODES[code]
    this.suggestions = options.suggestions ?? []
    this.retryable = options.retryable ?? false
    this.details = options.details ?? {}
  }

  toJSON(): {
    code: ErrorCode
    message: string
    retryable: boolean
    suggestions?: string[]
    details?: Record<string, unknown>
  } {
    return {
      code: this.code,
      message: this.message,
      retryable: this.retryable,
      ...(this.suggestions.length > 0 ? {suggestions: this.suggestions} : {}),
      ...(Object.keys(this.details).length > 0 ? {details: this.details} : {}),
    }
  }
}

export function isGatewayError(error: unknown): error is GatewayError {
  return error instanceof GatewayError
}

/** Wraps anything thrown into a GatewayError so callers have one shape to report. */
export function toGatewayError(error: unknown, code: ErrorCode = 'E_INTERNAL'): GatewayError {
  if (error instanceof GatewayError) return error
  const message = error instanceof Error ? error.message : String(error)
  return new GatewayError(code, message, {cause: error})
}

/**
 * What went wrong, in a word fit for a remote user: Node's code (EACCES, ENOSPC, ENAMETOOLONG) or a
 * GatewayError's. Never the message: it holds host paths and names an agent or sender chose.
 */
export function errorCode(error: unknown): string {
  const code = (error as {code?: unknown} | null | undefined)?.code
  return typeof code === 'string' && /^[A-Z][A-Z0-9_]{0,39}$/.test(code) ? code : 'unexpected error'
}
