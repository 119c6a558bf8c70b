export interface BackoffOptions {
  initialMs: number
  maxMs: number
}

/** The platform default: 1 s, doubling, capped at 30 s. */
export const DEFAULT_BACKOFF: BackoffOptions = {initialMs: 1000, maxMs: 30_000}

/** Exponential reconnect delays; `reset()` once a connection is healthy again. */
export class Backoff {
  private attempt = 0

  constructor(private readonly options: BackoffOptions = DEFAULT_BACKOFF) {}

  next(): number {
    const delay = Math.min(this.options.maxMs, this.options.initialMs * 2 ** this.attempt)
    if (delay < this.options.maxMs) this.attempt++
    return delay
  }

  reset(): void {
    this.attempt = 0
  }
}

export function formatDelay(ms: number): string {
  return ms < 1000 ? `${ms} ms` : `${Math.round(ms / 100) / 10} s`
}
