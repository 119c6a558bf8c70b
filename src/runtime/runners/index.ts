import type {GatewayConfig, IsolationLevel} from '../config/types.js'
import {GatewayError} from '../util/errors.js'
import type {Runner} from './types.js'

export async function runnerFor(level: IsolationLevel): Promise<Runner> {
  switch (level) {
    case 'unrestricted':
      return (await import('./unrestricted.js')).unrestrictedRunner
    case 'host-sandbox':
      return (await import('./host-sandbox.js')).hostSandboxRunner
    case 'container':
      return (await import('./container/runner.js')).containerRunner
    default:
      throw new GatewayError('E_ISOLATION_UNAVAILABLE', `the ${level} isolation level is not available in this build`, {
        suggestions: ['run with --unrestricted to run without isolation (only for trusted agents)'],
      })
  }
}

/**
 * Removes the standby containers this process started; returns those a hung engine kept (see
 * container/standby-pool.ts).
 */
export async function stopStandbyContainers(): Promise<string[]> {
  return (await import('./container/standby-pool.js')).stopStandbyContainers()
}

/** Ends the standby agent-runs this process started for a gateway home (see standby-agent-runs.ts). */
export async function stopStandbyAgentRuns(home: string): Promise<void> {
  return (await import('./standby-agent-runs.js')).stopStandbyAgentRuns(home)
}

/** Gives up on Docker work still pending at exit (see container/removals.ts); returns the containers left behind. */
export async function abandonEngineWork(): Promise<string[]> {
  return (await import('./container/removals.js')).abandonEngineWork()
}

/**
 * Asks the Docker engine whether it answers, for /healthz (see engine-probe.ts); loads Docker code
 * only when called.
 */
export async function probeEngine(signal?: AbortSignal): Promise<void> {
  return (await import('./container/engine-probe.js')).probeEngine(signal)
}

/** Starts asking each engine of the config's `engines:` list whether it answers (see container/engines.ts). */
export async function watchConfiguredEngines(config: GatewayConfig): Promise<void> {
  if (config.engines && config.engines.length > 0) (await import('./container/engines.js')).watchEngines(config)
}
