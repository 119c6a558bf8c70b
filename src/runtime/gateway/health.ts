import fs from 'node:fs'
import {dockerEngineProblem} from '../runners/container/engine-health.js'

/** Below this much free space in the gateway's home, new records and histories are about to fail. */
const LOW_DISK_BYTES = 16 * 1024 * 1024

export interface HealthSources {
  home: string
  /** Whether any agent runs in containers (only then does the engine's state matter). */
  usesContainers: () => boolean
  /** gateway.db cannot be used (deleted and not restorable, damaged): see GuardedGatewayDb. */
  stateProblem: () => string | undefined
}

/**
 * Why the gateway is `degraded`: it still answers what it can, but the operator must act. The
 * reasons come from what failed last (a run record that could not be written) and from checks
 * made when /healthz is asked (free disk, the Docker engine as the container runs found it).
 */
export class GatewayHealth {
  private recordFailure: string | undefined

  constructor(private readonly sources: HealthSources) {}

  /** Called after every run-record write: a failure is remembered until a write succeeds. */
  recordWritten(error?: unknown): void {
    if (!error) {
      this.recordFailure = undefined
      return
    }
    const message = (error as Error).message ?? String(error)
    const code = (error as {code?: string}).code ?? ''
    this.recordFailure = code === 'SQLITE_FULL' || /ENOSPC|database or disk is full/i.test(message)
      ? `disk full: run records cannot be written (${message})`
      : `state database unwritable: ${message}`
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
