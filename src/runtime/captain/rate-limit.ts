/**
 * Failed-attempt limiter for the login and setup endpoints: at most `maxFailures` failures per
 * client within `windowMs`. A success does not reset the count, so guessing between two
 * correct logins gains nothing.
 */
export class FailureRateLimiter {
  private readonly failures = new Map<string, number[]>()

  constructor(
    private readonly maxFailures = 5,
    private readonly windowMs = 5 * 60_000,
    private readonly now: () => number = Date.now,
  ) {}

  /** Seconds until the client may try again, or 0 when it may try now. */
  retryAfterSeconds(client: string): number {
    const recent = this.recent(client)
    if (recent.length < this.maxFailures) return 0
    return Math.max(1, Math.ceil((recent[0]! + this.windowMs - this.now()) / 1000))
  }

  recordFailure(client: string): void {
    const recent = this.recent(client)
    recent.push(this.now())
    this.failures.set(client, recent)
    if (this.failures.size > 10_000) this.prune()
  }

  private recent(client: string): number[] {
    const cutoff = this.now() - this.windowMs
    const recent = (this.failures.get(client) ?? []).filter((time) => time > cutoff)
    if (recent.length === 0) this.failures.delete(client)
    else this.failures.set(client, recent)
    return recent
  }

  private prune(): void {
    for (const client of [...this.failures.keys()]) this.recent(client)
  }
}
