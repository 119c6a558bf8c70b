/** One failed attempt at one provider, in a shape the retry loop can decide on. */
export class ProviderFailure extends Error {
  readonly provider: string
  /** HTTP status, or null when no response arrived (network error, timeout, missing key). */
  readonly status: number | null
  readonly retryable: boolean
  /** What the server asked us to wait (Retry-After), when it said. */
  readonly retryAfterMs: number | undefined

  constructor(
    provider: string,
    message: string,
    options: {status?: number | null; retryable: boolean; retryAfterMs?: number; cause?: unknown},
  ) {
    super(message, options.cause === undefined ? undefined : {cause: options.cause})
    this.name = 'ProviderFailure'
    this.provider = provider
    this.status = options.status ?? null
    this.retryable = options.retryable
    this.retryAfterMs = options.retryAfterMs
  }
}

/** 429 and 5xx are the server saying "not now"; every other 4xx will fail the same way again. */
export function isRetryableStatus(status: number): boolean {
  return status === 429 || status >= 500
}

const MAX_MESSAGE_CHARS = 300

interface SdkErrorLike {
  status?: unknown
  headers?: {get(name: string): string | null} | null
  error?: unknown
  apiMessage?: unknown
  message?: string
  cause?: unknown
}

/**
 * The error classes an official SDK exports. Both SDKs are generated from one template; each
 * provider module passes its own, so classification uses instanceof and never a class name
 * (a bundler renames classes: esbuild turned APIConnectionError into APIConnectionError3).
 */
export interface SdkErrorClasses {
  APIError: abstract new (...args: never[]) => Error
  APIConnectionError: abstract new (...args: never[]) => Error
  APIConnectionTimeoutError: abstract new (...args: never[]) => Error
  APIUserAbortError: abstract new (...args: never[]) => Error
}

/** Socket-level codes (Node's and undici's) of a connection that failed or broke: worth another attempt. */
const NETWORK_CODES = new Set([
  'ECONNREFUSED',
  'ECONNRESET',
  'ECONNABORTED',
  'EPIPE',
  'ETIMEDOUT',
  'EHOSTUNREACH',
  'ENETUNREACH',
  'ENETDOWN',
  'EHOSTDOWN',
  'ENOTFOUND',
  'EAI_AGAIN',
  'EADDRNOTAVAIL',
  'ERR_STREAM_PREMATURE_CLOSE',
  'UND_ERR_SOCKET',
  'UND_ERR_CONNECT_TIMEOUT',
  'UND_ERR_HEADERS_TIMEOUT',
  'UND_ERR_BODY_TIMEOUT',
  'UND_ERR_CLOSED',
])

/** The error and its causes, outermost first. */
function causeChain(error: unknown): unknown[] {
  const chain: unknown[] = []
  for (let current = error, depth = 0; current && depth < 6; depth++, current = (current as {cause?: unknown}).cause)
    chain.push(current)
  return chain
}

/**
 * Translates whatever an SDK call threw into a ProviderFailure: by HTTP status, by the SDK's own
 * classes (instanceof), then by structure (socket error codes, a body that did not parse).
 */
export function failureFromSdkError(provider: string, error: unknown, sdk?: SdkErrorClasses): ProviderFailure {
  if (error instanceof ProviderFailure) return error
  const sdkError = (error ?? {}) as SdkErrorLike
  const status = typeof sdkError.status === 'number' ? sdkError.status : null
  if (status !== null) {
    return new ProviderFailure(provider, `HTTP ${status}: ${apiErrorMessage(sdkError)}`, {
      status,
      retryable: isRetryableStatus(status),
      retryAfterMs: retryAfterMs(sdkError.headers),
      cause: error,
    })
  }
  if (sdk && error instanceof sdk.APIUserAbortError) {
    // The retry loop tells our own timeout apart from the caller cancelling; here it is just an abort.
    return new ProviderFailure(provider, 'request aborted', {retryable: false, cause: error})
  }
  if (sdk && error instanceof sdk.APIConnectionTimeoutError) {
    return new ProviderFailure(provider, 'request timed out', {retryable: true, cause: error})
  }
  const chain = causeChain(error)
  if (
    (sdk && error instanceof sdk.APIConnectionError) ||
    chain.some((link) => NETWORK_CODES.has(String((link as {code?: unknown}).code)))
  ) {
    return new ProviderFailure(provider, `network error: ${networkReason(error)}`, {retryable: true, cause: error})
  }
  if (chain.some((link) => link instanceof SyntaxError)) {
    // A 200 whose body (or a stream event) is not what the API sends: a broken proxy or server, maybe transient.
    return new ProviderFailure(
      provider,
      `the response did not parse: ${truncate((error as Error).message ?? String(error))}`,
      {retryable: true, cause: error},
    )
  }
  if (sdk && error instanceof sdk.APIError) {
    // An error event in the middle of a stream (e.g. Anthropic's overloaded_error): server-side and transient.
    return new ProviderFailure(provider, `stream error: ${apiErrorMessage(sdkError)}`, {retryable: true, cause: error})
  }
  // Anything else is a bug or a response we could not understand; retrying would repeat it.
  const message = error instanceof Error ? error.message : String(error)
  return new ProviderFailure(provider, truncate(message), {retryable: false, cause: error})
}

/** A streamed answer that stopped before the API's terminal event: never a reply, always worth another attempt. */
export function incompleteStream(provider: string, terminal: string, cause?: unknown): ProviderFailure {
  const why = cause instanceof Error ? `: ${truncate(cause.message)}` : ''
  return new ProviderFailure(provider, `the streamed answer ended before ${terminal} (incomplete)${why}`, {
    retryable: true,
    cause,
  })
}

/** The server's own words: both APIs put a human message inside their error body. */
function apiErrorMessage(error: SdkErrorLike): string {
  const body = error.error as {message?: unknown; error?: {message?: unknown}} | undefined
  const candidates = [error.apiMessage, body?.error?.message, body?.message]
  const found = candidates.find((value): value is string => typeof value === 'string' && value.length > 0)
  const text = found ?? (error.message ?? '').replace(/^\d{3}\s+/, '')
  return truncate(text || 'no error message in the response')
}

/** fetch hides the useful part (ECONNREFUSED, ENOTFOUND...) a few `cause`s down. */
function networkReason(error: unknown): string {
  let current: unknown = error
  for (let depth = 0; depth < 5 && current; depth++) {
    const code = (current as {code?: unknown}).code
    if (typeof code === 'string') {
      const message = truncate((current as Error).message ?? '')
      return message.includes(code) ? message : `${code}: ${message}`
    }
    current = (current as {cause?: unknown}).cause
  }
  return truncate(error instanceof Error ? error.message : String(error))
}

/** `retry-after-ms` (OpenAI/Anthropic extension), then `retry-after` in seconds or as an HTTP date. */
export function retryAfterMs(headers: SdkErrorLike['headers'], now = Date.now()): number | undefined {
  if (!headers || typeof headers.get !== 'function') return undefined
  const millis = Number.parseFloat(headers.get('retry-after-ms') ?? '')
  if (Number.isFinite(millis) && millis >= 0) return millis
  const value = headers.get('retry-after')
  if (!value) return undefined
  const seconds = Number.parseFloat(value)
  if (Number.isFinite(seconds) && seconds >= 0) return seconds * 1000
  const date = Date.parse(value)
  return Number.isNaN(date) ? undefined : Math.max(0, date - now)
}

function truncate(text: string): string {
  const oneLine = text.replace(/\s+/g, ' ').trim()
  return oneLine.length > MAX_MESSAGE_CHARS ? `${oneLine.slice(0, MAX_MESSAGE_CHARS)}…` : oneLine
}
