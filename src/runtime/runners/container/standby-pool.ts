import {setTimeout as sleep} from 'node:timers/promises'
import type {DockerCli} from '../../../sandbox/docker/cli.js'
import {toGatewayError} from '../../util/errors.js'
import {signalChild} from '../../util/subprocess.js'
import {admitStandby, releaseStandby, standbysAllowed, type BudgetedStandby} from '../standby-budget.js'
import type {AgentContainer} from './agent-container.js'
import {
  containerRemovalsSettled,
  giveUpRemovals,
  owedRemovalNames,
  scheduleRemoval,
  track,
  trackRemoval,
} from './removals.js'

/**
 * Standby containers: after a gateway's run, the agent's next container is started at once and
 * waits, agent-run loaded, for its message, which then skips container and Node start-up. Each
 * still serves exactly one message. One per agent, discarded when the run's shape changes
 * (config, image, secrets), when the standby budget takes it back (idle too long, or room for a
 * more recently used agent: standby-budget.ts), and when the gateway stops.
 */
const standbys = new Map<string, {container: AgentContainer; cli: DockerCli; budgeted: BudgetedStandby}>()
/** Standbys still being started: stopping must wait for them, or one would outlive the gateway. */
const preparingStandbys = new Set<Promise<void>>()

/** The slot's standby when it matches the run's shape `key` and still runs; a mismatched one is discarded. */
export function takeStandby(slot: string, key: string): AgentContainer | undefined {
  const entry = removeStandby(slot)
  if (entry && entry.container.key === key && entry.container.child.exitCode === null) return entry.container
  if (entry) discard(entry)
  return undefined
}

/** Takes a slot's standby out of the pool (to use or discard it). */
function removeStandby(slot: string): {container: AgentContainer; cli: DockerCli} | undefined {
  const entry = standbys.get(slot)
  if (!entry) return undefined
  standbys.delete(slot)
  releaseStandby(entry.budgeted)
  return entry
}

/** How long a discarded standby's docker client may take to exit before it is killed. */
const DISCARD_CLIENT_WAIT_MS = 10_000

/**
 * Removed at once (which stops it), and again once its docker client has exited: a container
 * the engine was still creating when the first removal ran would otherwise outlive the gateway.
 */
function discard({container, cli}: {container: AgentContainer; cli: DockerCli}): void {
  container.child.stdin?.destroy()
  discarding.add(container)
  void trackRemoval(
    (async () => {
      await scheduleRemoval(cli, container.name, () => {})
      const exited = await Promise.race([
        container.child.then(() => true),
        sleep(DISCARD_CLIENT_WAIT_MS, false, {ref: false}),
      ])
      if (!exited) signalChild(container.child, 'SIGKILL')
      if (!owedRemovalNames().includes(container.name)) await scheduleRemoval(cli, container.name, () => {})
    })().finally(() => discarding.delete(container)),
  )
}

/** Discarded standbys whose docker client may still be running (killed when shutdown cannot wait). */
const discarding = new Set<AgentContainer>()
/** Those of them a stop already gave up on (the engine did not answer): not waited for again. */
const givenUp = new WeakSet<AgentContainer>()
/** Aborts image checks of standbys still being prepared when the gateway stops. */
let standbyPreparation = new AbortController()

/**
 * Starts the slot's standby unless it has one: `prepare` readies what the container needs (its
 * image, under the pool's signal) and returns how to start it, called only if the slot is still free.
 */
export function prepareStandby(
  slot: string,
  cli: DockerCli,
  prepare: (signal: AbortSignal) => Promise<() => AgentContainer>,
  log: (line: string) => void,
): void {
  const preparing = (async () => {
    if (standbys.has(slot) || !standbysAllowed()) return
    const start = await prepare(standbyPreparation.signal)
    if (standbys.has(slot) || standbyPreparation.signal.aborted || !standbysAllowed()) return
    const container = start()
    const discardIfWaiting = () => {
      if (standbys.get(slot)?.container === container) discard(removeStandby(slot)!)
    }
    // One that ends on its own (engine restart, killed) is only removed: the next run starts cold.
    void container.child.then(discardIfWaiting)
    // its processes are the engine's: what they hold is not measured from here
    const budgeted: BudgetedStandby = {level: 'container', evict: discardIfWaiting, residentBytes: () => undefined}
    standbys.set(slot, {container, cli, budgeted})
    if (!admitStandby(budgeted)) discardIfWaiting()
  })()
  void track(
    preparingStandbys,
    preparing.catch((error: unknown) => log(`could not start a standby container: ${toGatewayError(error).message}`)),
  )
}

/** How long stopping the standbys may wait for the engine before their docker clients are killed. */
const STOP_STANDBYS_TIMEOUT_MS = 3_000

/**
 * Removes every standby container of this process (gateway shutdown, tests) and waits for the
 * removals, at most `timeoutMs`: a hung engine must not hold the shutdown. Returns the names of
 * containers left for the next start-up (it removes containers whose owner is gone).
 */
export async function stopStandbyContainers(options: {timeoutMs?: number} = {}): Promise<string[]> {
  const timeoutMs = options.timeoutMs ?? STOP_STANDBYS_TIMEOUT_MS
  // an earlier call is already removing (or gave up on) the rest
  if (
    standbys.size === 0 &&
    preparingStandbys.size === 0 &&
    [...discarding].every((container) => givenUp.has(container))
  )
    return []
  const preparation = standbyPreparation
  const stopping = (async () => {
    await Promise.race([Promise.all([...preparingStandbys]), sleep(timeoutMs, undefined, {ref: false})])
    preparation.abort()
    for (const slot of [...standbys.keys()]) discard(removeStandby(slot)!)
    await containerRemovalsSettled()
  })()
  const done = await Promise.race([stopping.then(() => true), sleep(timeoutMs, false, {ref: false})])
  standbyPreparation = new AbortController()
  if (done) return []
  const left = [...discarding].map((container) => container.name)
  for (const container of discarding) {
    signalChild(container.child, 'SIGKILL')
    givenUp.add(container)
  }
  giveUpRemovals()
  return [...new Set([...left, ...owedRemovalNames()])]
}
