/** A sliding window of event times. */
class Window {
  private times: number[] = []

  constructor(private readonly windowMs: number) {}

  count(now: number): number {
    const cutoff = now - this.windowMs
    if (this.times.length > 0 && this.times[0]! <= cutoff) this.times = this.times.filter((time) => time > cutoff)
    return this.times.length
  }

  add(now: number): void {
    this.times.push(now)
  }

  /** Takes back one event at `time` (a check that turned out right). */
  remove(time: number): void {
    const index = this.times.lastIndexOf(time)
    if (index >= 0) this.times.splice(index, 1)
  }

  retryAfterSeconds(now: number): number {
    return Math.max(1, Math.ceil(((this.times[0] ?? now) + this.windowMs - now) / 1000))
  }
}

export interface PasswordGuardLimits {
  /** Wrong guesses one address may make per window. */
  perClient: number
  perClientWindowMs: number
  /** Wrong guesses of all addresses together per window: another loopback address gets no fresh budget. */
  global: number
  globalWindowMs: number
}

export const DEFAULT_GUARD_LIMITS: PasswordGuardLimits = {
  perClient: 5,
  perClientWindowMs: 5 * 60_000,
  global: 20,
  globalWindowMs: 60_000,
}

export type GuardTicket = {ok: true; succeeded(): void} | {ok: false; retryAfterSeconds: number}

/**
 * Limits password and setup-code checks. Every attempt is counted when it starts, before the
 * secret is looked at, so parallel guesses cannot all slip in before the first one fails; only a
 * right answer gives its slots back. The global cap holds whatever the source address;
 * an operator locked out by a noisy neighbour gets in with `meepagateway dashboard link`.
 */
export class PasswordGuard {
  private readonly clients = new Map<string, Window>()
  private readonly all: Window

  constructor(
    private readonly limits: PasswordGuardLimits = DEFAULT_GUARD_LIMITS,
    private readonly now: () => number = Date.now,
  ) {
    this.all = new Window(limits.globalWindowMs)
  }

  begin(client: string): GuardTicket {
    const now = this.now()
    const mine = this.clients.get(client) ?? new Window(this.limits.perClientWindowMs)
    if (mine.count(now) >= this.limits.perClient) return {ok: false, retryAfterSeconds: mine.retryAfterSeconds(now)}
    if (this.all.count(now) >= this.limits.global)
      return {ok: false, retryAfterSeconds: this.all.retryAfterSeconds(now)}
    mine.add(now)
    this.all.add(now)
    this.clients.set(client, mine)
    if (this.clients.size > 10_000) this.prune(now)
    return {
      ok: true,
      succeeded: () => {
        mine.remove(now)
        this.all.remove(now)
      },
    }
  }

  private prune(now: number): void {
    for (const [client, window] of this.clients) if (window.count(now) === 0) this.clients.delete(client)
  }
}
