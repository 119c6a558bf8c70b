import fs from 'node:fs'
import type {Connector} from '../connectors/types.js'
import {dockerEngineProblem, downEngineReasons} from '../runners/container/engine-health.js'
import {sharedAbortController} from '../util/shared-abort.js'

/** Below this much free space in the gateway's home, new records and histories are about to fail. */
const LOW_DISK_BYTES = 16 * 1024 * 1024
/** How often the Docker engine is asked whether it answers (while some agent runs in containers). */
export const ENGINE_PROBE_INTERVAL_MS = 5_000

export interface HealthSources {
  home: string
  /** Whether any agent runs in containers (only then does the engine's state matter). */
  usesContainers: () => boolean
  /** gateway.db cannot be used (deleted and not restorable, damaged): see GuardedGatewayDb. */
  stateProblem: () => string | undefined
  /** The chat connectors, each with its state. */
  connectors?: () => readonly Connector[]
  /** Asks the engine and reports what it found to engine-health.ts (runners/engine-probe.ts). */
  probeEngine?: (signal: AbortSignal) => Promise<void>
  /** The reply outbox: replies waiting, and how many were given up on since a time. */
  replies?: () => {pending: number; undeliverableSince: (since: number) => number}
}

/** An undeliverable reply keeps /healthz `degraded` this long, so the operator notices it. */
const UNDELIVERABLE_DEGRADES_MS = 60 * 60_000
const DAY_MS = 24 * 60 * 60_000

/**
 * Why the gateway is `degraded`: it still answers what it can, but the operator must act. The
 * reasons come from what failed last (a run record that could not be written), from checks
 * made when /healthz is asked (free disk, each connector's state) and from the engine probe,
 * which asks the Docker engine every few seconds without waiting for a run (`watch`).
 */
export class GatewayHealth {
  private recordFailure: string | undefined
  private readonly stopped = sharedAbortController()
  private probeTimer: NodeJS.Timeout | undefined

  constructor(private readonly sources: HealthSources) {}

  /** Starts the engine probe (only while some agent runs in containers); `stop` ends it. */
  watch(intervalMs = ENGINE_PROBE_INTERVAL_MS): void {
    const {probeEngine} = this.sources
    if (!probeEngine) return
    const tick = async () => {
      if (this.sources.usesContainers()) await probeEngine(this.stopped.signal).catch(() => {})
      if (!this.stopped.signal.aborted) this.probeTimer = setTimeout(() => void tick(), intervalMs).unref()
    }
    void tick()
  }

  stop(): void {
    this.stopped.abort()
    clearTimeout(this.probeTimer)
  }

  /** Called after every run-record write: a failure is remembered until a write succeeds. */
  recordWritten(error?: unknown): void {
    if (!error) {
      this.recordFailure = undefined
      return
    }
    const message = (error as Error).message ?? String(error)
    const code = (error as {code?: string}).code ?? ''
    this.recordFailure =
      code === 'SQLITE_FULL' || /ENOSPC|database or disk is full/i.test(message)
        ? `disk full: run records cannot be written (${message})`
        : `state database unwritable: ${message}`
  }

  /** For /healthz: replies waiting in the outbox and those given up on in the last 24 hours. */
  replies(): {pending: number; undeliverable_24h: number} | undefined {
    const replies = this.sources.replies?.()
    if (!replies) return undefined
    try {
      return {pending: replies.pending, undeliverable_24h: replies.undeliverableSince(Date.now() - DAY_MS)}
    } catch {
      return undefined // gateway.db unusable: a reason of its own
    }
  }

  private undeliverableSince(since: number): number {
    try {
      return this.sources.replies?.().undeliverableSince(since) ?? 0
    } catch {
      return 0 // gateway.db unusable: reported as such above
    }
  }

  reasons(): string[] {
    const reasons: string[] = []
    const state = this.sources.stateProblem()
    if (state) reasons.push(`state database unwritable: ${state}`)
    if (this.recordFailure) reasons.push(this.recordFailure)
    const free = freeBytes(this.sources.home)
    if (free !== undefined && free < LOW_DISK_BYTES && !reasons.some((reason) => reason.startsWith('disk full'))) {
      reasons.push(`disk full: ${Math.floor(free / 1024)} KiB free in ${this.sources.home}`)
    }
    const engine = this.sources.usesContainers() ? dockerEngineProblem() : undefined
    if (engine) reasons.push(`engine down: ${engine.reason} (since ${new Date(engine.since).toISOString()})`)
    const undeliverable = this.undeliverableSince(Date.now() - UNDELIVERABLE_DEGRADES_MS)
    if (undeliverable > 0)
      reasons.push(`replies undeliverable: ${undeliverable} in the last hour (see \`meepagateway runs\`)`)
    if (this.sources.usesContainers()) reasons.push(...downEngineReasons())
    for (const connector of this.sources.connectors?.() ?? []) {
      const problem = connector.problem
      if (problem) reasons.push(`connector ${connector.name} ${problem}`)
    }
    return reasons
  }
}

function freeBytes(dir: string): number | undefined {
  try {
    const stats = fs.statfsSync(dir)
    return stats.bavail * stats.bsize
  } catch {
    return undefined
  }
}
