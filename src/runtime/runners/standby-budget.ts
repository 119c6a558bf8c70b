import type {GatewayConfig, IsolationLevel} from '../config/types.js'
import {DEFAULT_GATEWAY} from '../config/defaults.js'

/**
 * The operator's budget for what a running gateway holds ahead of messages, every level at once
 * (standby agent-runs, standby containers): at most `gateway.max_standbys`, each ended after
 * `gateway.standby_idle_minutes` without its message, and the agent whose standby was made
 * longest ago (a standby is made when the agent's run ends) loses it first to make room.
 */
export interface BudgetedStandby {
  readonly level: IsolationLevel
  /** Ends it: the budget takes it back (idle too long, or room for a more recently used agent). */
  evict(): void
  /** Resident memory of its processes in bytes; undefined where it cannot be measured from here. */
  residentBytes(): number | undefined
}

let budget = {max: DEFAULT_GATEWAY.max_standbys, idleMs: DEFAULT_GATEWAY.standby_idle_minutes * 60_000}
/** Each admitted standby and its idle timer, least recently made first. */
const held = new Map<BudgetedStandby, NodeJS.Timeout>()

/** The budget of the config the next standby is made under. */
export function setStandbyBudget(
  gateway: Pick<GatewayConfig['gateway'], 'max_standbys' | 'standby_idle_minutes'>,
): void {
  budget = {max: gateway.max_standbys, idleMs: gateway.standby_idle_minutes * 60_000}
}

/** How long a standby may wait for its message. */
export function standbyIdleMs(): number {
  return budget.idleMs
}

/** Whether a standby may be made at all (a budget of 0 turns them off). */
export function standbysAllowed(): boolean {
  return budget.max > 0
}

/**
 * Counts a new standby against the budget, ending the least recently made ones while it is full;
 * false (nothing counted) when the budget allows none.
 */
export function admitStandby(standby: BudgetedStandby): boolean {
  if (budget.max <= 0) return false
  for (const oldest of held.keys()) {
    if (held.size < budget.max) break
    releaseStandby(oldest)
    oldest.evict()
  }
  const idle = setTimeout(() => {
    if (!held.has(standby)) return
    releaseStandby(standby)
    standby.evict()
  }, budget.idleMs)
  held.set(standby, idle.unref())
  return true
}

/** Its owner took it for a message or ended it: it no longer counts. */
export function releaseStandby(standby: BudgetedStandby): void {
  clearTimeout(held.get(standby))
  held.delete(standby)
}

export interface StandbyUsage {
  count: number
  /** Resident memory of those that can be measured here, in bytes. */
  resident_bytes: number
  by_level: Partial<Record<IsolationLevel, {count: number; resident_bytes: number; unmeasured?: number}>>
  max: number
  idle_minutes: number
}

/** What the standbys hold now, for /healthz and the dashboard. */
export function standbyUsage(): StandbyUsage {
  const usage: StandbyUsage = {
    count: held.size,
    resident_bytes: 0,
    by_level: {},
    max: budget.max,
    idle_minutes: budget.idleMs / 60_000,
  }
  for (const standby of held.keys()) {
    const level = (usage.by_level[standby.level] ??= {count: 0, resident_bytes: 0})
    level.count++
    const bytes = standby.residentBytes()
    if (bytes === undefined) level.unmeasured = (level.unmeasured ?? 0) + 1
    else {
      level.resident_bytes += bytes
      usage.resident_bytes += bytes
    }
  }
  return usage
}
