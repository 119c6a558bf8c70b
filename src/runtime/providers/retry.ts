import {setTimeout as delay} from 'node:timers/promises'

import type {ProviderConfig} from '../config/types.js'
import {GatewayError} from '../util/errors.js'
import {failureFromSdkError, ProviderFailure} from './failure.js'
import type {ChatProvider, ChatRequest, ChatResponse} from '../shapes/provider-types.js'

export const DEFAULT_MAX_RETRIES = 2
export const DEFAULT_TIMEOUT_SECONDS = 120
export const DEFAULT_BASE_DELAY_MS = 200
/** Longest backoff between two attempts, whatever the attempt number. */
export const MAX_BACKOFF_MS = 10_000
/**
 * Longest Retry-After we sit out. A server asking for more (a rate-limit window of minutes) is
 * done for this message: we move on to the fallback instead of holding the user for minutes.
 */
export const DEFAULT_RETRY_AFTER_CAP_MS = 30_000

export interface RetryOptions {
  /** First backoff; doubles each retry. MEEPA_RETRY_BASE_MS overrides the default so tests stay quick. */
  baseDelayMs: number
  retryAfterCapMs: number
  /** Injected by tests; Math.random otherwise. */
  random: () => number
}

/** One failed attempt, as reported in E_PROVIDER's details. */
export interface AttemptRecord {
  provider: string
  /** HTTP status, or null when there was no response (network error, timeout, missing key). */
  status: number | null
  message: string
}

export function retryOptions(
  overrides: Partial<RetryOptions> = {},
  env: NodeJS.ProcessEnv = process.env,
): RetryOptions {
  const fromEnv = Number.parseInt(env.MEEPA_RETRY_BASE_MS ?? '', 10)
  return {
    baseDelayMs: overrides.baseDelayMs ?? (Number.isFinite(fromEnv) && fromEnv >= 0 ? fromEnv : DEFAULT_BASE_DELAY_MS),
    retryAfterCapMs: overrides.retryAfterCapMs ?? DEFAULT_RETRY_AFTER_CAP_MS,
    random: overrides.random ?? Math.random,
  }
}

export function requestTimeoutMs(config: ProviderConfig): number {
  return (config.timeout_seconds ?? DEFAULT_TIMEOUT_SECONDS) * 1000
}

/**
 * Exponential backoff with "equal jitter": half the step is fixed, half random, so clients that
 * failed together do not come back together. A Retry-After from the server is a floor.
 */
export function backoffDelayMs(retryNumber: number, options: RetryOptions, retryAfterMs?: number): number {
  const step = Math.min(MAX_BACKOFF_MS, options.baseDelayMs * 2 ** (retryNumber - 1))
  const jittered = step / 2 + options.random() * (step / 2)
  return Math.max(jittered, retryAfterMs ?? 0)
}

/**
 * Calls one provider until it answers or its attempts are spent (1 + max_retries), each attempt
 * bounded by the provider's timeout_seconds. Every failure is appended to `attempts`; when the
 * provider is given up on, the last failure is thrown for the chain to move on to the next.
 * A cancelled `request.signal` ends everything at once with a GatewayError.
 */
export async function chatWithRetries(
  provider: ChatProvider,
  request: ChatRequest,
  options: RetryOptions,
  attempts: AttemptRecord[],
): Promise<ChatResponse> {
  const maxRetries = provider.config.max_retries ?? DEFAULT_MAX_RETRIES
  const timeoutMs = requestTimeoutMs(provider.config)
  for (let attempt = 1; ; attempt++) {
    throwIfCancelled(request.signal, attempts)
    const timeout = AbortSignal.timeout(timeoutMs)
    const signal = request.signal ? AbortSignal.any([request.signal, timeout]) : timeout
    let failure: ProviderFailure
    try {
      return await provider.chat({...request, signal})
    } catch (error) {
      throwIfCancelled(request.signal, attempts)
      failure = timeout.aborted
        ? new ProviderFailure(provider.name, `no answer within ${timeoutMs / 1000}s (timeout_seconds)`, {
            retryable: true,
            cause: error,
          })
        : failureFromSdkError(provider.name, error)
    }

    let spent = !failure.retryable || attempt > maxRetries
    if (!spent && (failure.retryAfterMs ?? 0) > options.retryAfterCapMs) {
      const seconds = Math.ceil(failure.retryAfterMs! / 1000)
      failure = new ProviderFailure(
        provider.name,
        `${failure.message} (asked to retry after ${seconds}s, more than the ${options.retryAfterCapMs / 1000}s we wait)`,
        {status: failure.status, retryable: true, cause: failure},
      )
      spent = true
    }
    attempts.push(record(failure))
    if (spent) throw failure

    try {
      await delay(backoffDelayMs(attempt, options, failure.retryAfterMs), undefined, {signal: request.signal})
    } catch {
      throwIfCancelled(request.signal, attempts)
    }
  }
}

function record(failure: ProviderFailure): AttemptRecord {
  return {provider: failure.provider, status: failure.status, message: failure.message}
}

function throwIfCancelled(signal: AbortSignal | undefined, attempts: AttemptRecord[]): void {
  if (!signal?.aborted) return
  // Whoever cancelled (agent-run's own deadline, a shutdown) may have said why with a GatewayError.
  if (signal.reason instanceof GatewayError) throw signal.reason
  const why = signal.reason instanceof Error ? signal.reason.message : String(signal.reason ?? 'aborted')
  throw new GatewayError('E_PROVIDER', `LLM request cancelled: ${why}`, {retryable: false, details: {attempts}})
}
