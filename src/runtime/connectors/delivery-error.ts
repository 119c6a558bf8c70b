/**
 * One send attempt that failed, as the platform's answer classifies it: `retry` when trying again
 * later may work (unreachable, 5xx, rate limited), with the wait the platform asked for, if any.
 */
export class DeliveryError extends Error {
  constructor(
    message: string,
    readonly retry: boolean,
    /** The platform's Retry-After (or its library's rate-limit wait), in ms. */
    readonly retryAfterMs?: number,
  ) {
    super(message)
    this.name = 'DeliveryError'
  }
}

/** Any error from a send attempt as a DeliveryError; an unclassified one is worth retrying. */
export function asDeliveryError(error: unknown): DeliveryError {
  if (error instanceof DeliveryError) return error
  return new DeliveryError((error as Error)?.message ?? String(error), true)
}

/** HTTP statuses worth retrying: timeouts, rate limits and the server's own failures. */
export function retryableStatus(status: number): boolean {
  return status === 408 || status === 425 || status === 429 || status >= 500
}

/** A Retry-After header (seconds, or an HTTP date) in ms; undefined when absent or unreadable. */
export function retryAfterMs(header: string | null | undefined): number | undefined {
  if (!header) return undefined
  const seconds = Number(header)
  if (Number.isFinite(seconds) && seconds >= 0) return Math.ceil(seconds * 1000)
  const date = Date.parse(header)
  return Number.isNaN(date) ? undefined : Math.max(0, date - Date.now())
}
