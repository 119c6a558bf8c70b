import {performance} from 'node:perf_hooks'
import type {AgentRunOutput} from '../shapes/agent-run-contract.js'
import {failure} from '../agent-run/output.js'

/**
 * A deadline noticed this much later than it fell was not passed by a running process (a busy
 * event loop is late by milliseconds): the gateway was stopped (SIGSTOP) across it.
 */
const SUSPENDED_AFTER_MS = 1000

/**
 * A run's deadline as its owner sees it, on the monotonic clock. It is reached by the owner's own
 * timer or by the keeper's word that it ended the run (`passed`); either way the owner learns how
 * late it noticed, so "took too long" is said only of a deadline that passed while it was running.
 */
export class DeadlineWatch {
  reached = false
  /** How late the owner noticed the deadline, when it was stopped across it. */
  suspendedMs: number | undefined
  private readonly at: number
  private readonly timer: NodeJS.Timeout

  constructor(
    private readonly timeoutMs: number,
    private readonly onReached: () => void,
  ) {
    this.at = performance.now() + timeoutMs
    this.timer = setTimeout(this.passed, timeoutMs)
  }

  readonly passed = (): void => {
    if (this.reached) return
    this.reached = true
    clearTimeout(this.timer)
    const late = performance.now() - this.at
    if (late > SUSPENDED_AFTER_MS) this.suspendedMs = Math.round(late)
    this.onReached()
  }

  stop(): void {
    clearTimeout(this.timer)
  }

  /**
   * The run's E_TIMEOUT: `tookTooLong(seconds)` when the owner was running at the deadline, else
   * what happened while it was stopped.
   */
  failure(
    runId: string,
    tookTooLong: (seconds: number) => string,
    details: Record<string, unknown> = {},
  ): AgentRunOutput {
    const seconds = Math.round(this.timeoutMs / 1000)
    if (this.suspendedMs === undefined) return failure(runId, 'E_TIMEOUT', tookTooLong(seconds), false, details)
    return failure(
      runId,
      'E_TIMEOUT',
      `the gateway was stopped (suspended) when the run's ${seconds} s deadline passed, and noticed it ${Math.round(this.suspendedMs / 1000)} s late; the run had not answered and was ended at its deadline`,
      false,
      {...details, gateway_suspended_ms: this.suspendedMs},
    )
  }
}
