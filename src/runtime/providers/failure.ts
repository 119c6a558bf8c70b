/**
 * One failed attempt at one provider, in a shape the retry loop can decide on. Both official SDKs
 * are generated from the same template (APIError with `status` and `headers`, APIConnectionError,
 * APIUserAbortError), so one duck-typed translation serves both.
 */
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

/** Translates whatever an SDK call threw into a ProviderFailure. */
export function failureFromSdkError(provider: string, error: unknown): ProviderFailure {
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
  const classes = sdkClassNames(error)
  if (classes.has('APIUserAbortError')) {
    // The retry loop tells our own timeout apart from the caller cancelling; here it is just an abort.
    return new ProviderFailure(provider, 'request aborted', {retryable: false, cause: error})
  }
  if (classes.has('APIConnectionTimeoutError')) {
    return new ProviderFailure(provider, 'request timed out', {retryable: true, cause: error})
  }
  if (classes.has('APIConnectionError')) {
    return new ProviderFailure(provider, `network error: ${networkReason(error)}`, {retryable: true, cause: error})
  }
  if (classes.has('APIError')) {
    // An error event in the middle of a stream (e.g. Anthropic's overloaded_error): server-side and transient.
    return new ProviderFailure(provider, `stream error: ${apiErrorMessage(sdkError)}`, {retryable: true, cause: error})
  }
  // Anything else is a bug or a response we could not understand; retrying would repeat it.
  const message = error instanceof Error ? error.message : String(error)
  return new ProviderFailure(provider, truncate(message), {retryable: false, cause: error})
}

/**
 * Class names along the prototype chain. The openai SDK leaves `error.name` as plain "Error", and
 * instanceof would tie this module to both SDKs, which are loaded lazily (they cost 60-150 ms).
 */
function sdkClassNames(error: unknown): Set<string> {
  const names = new Set<string>()
  let proto = error && typeof error === 'object' ? Object.getPrototypeOf(error) : null
  while (proto && proto !== Error.prototype) {
    names.add((proto as {constructor: {name: string}}).constructor.name)
    proto = Object.getPrototypeOf(proto)
  }
  return names
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
