import {setTimeout as sleep} from 'node:timers/promises'
import type {DockerCli} from '../../../sandbox/docker/cli.js'
import {GatewayError, toGatewayError} from '../../util/errors.js'
import {signalChild} from '../../util/subprocess.js'
import {admitStandby, releaseStandby, standbysAllowed, type BudgetedStandby} from '../standby-budget.js'
import type {AgentContainer} from './agent-container.js'
import {onEngineDown} from './engine-health.js'
import {
  containerRemovalsSettled,
  giveUpRemovals,
  owedRemovalNames,
  removeWhenEngineAnswers,
  scheduleRemoval,
  track,
  trackRemoval,
} from './removals.js'
import {sharedAbortController} from '../../util/shared-abort.js'

/**
 * Standby containers: after a gateway's run, the agent's next container is started at once and
 * waits, agent-run loaded, for its message, which then skips container and Node start-up. Each
 * still serves exactly one message. One per agent, discarded when the run's shape changes
 * (config, image, secrets), when the standby budget takes it back (idle too long, or room for a
 * more recently used agent: standby-budget.ts), and when the gateway stops. Each waits on one
 * engine (where the agent's next run would be placed), serves only a run placed there, and is
 * dropped when that engine goes down.
 */
interface Waiting {
  container: AgentContainer
  cli: DockerCli
  engine: string
  budgeted: BudgetedStandby
}
const standbys = new Map<string, Waiting>()
/** Standbys still being started: stopping must wait for them, or one would outlive the gateway. */
const preparingStandbys = new Set<Promise<void>>()

/**
 * The slot's standby when it waits on `engine`, matches the run's shape `key` and still runs; a
 * mismatched one is discarded, one on another engine left waiting.
 */
export function takeStandby(slot: string, key: string, engine: string): AgentContainer | undefined {
  if (standbys.get(slot)?.engine !== engine) return undefined
  const entry = removeStandby(slot)
  if (entry && entry.container.key === key && entry.container.child.exitCode === null) return entry.container
  if (entry) discard(entry)
  return undefined
}

/** A standby taken for a message whose container never existed: nothing of the message ran in it. */
export class StandbyNeverStarted extends GatewayError {
  constructor(container: string, why: string) {
    super('E_DOCKER', `standby container ${container} never started: ${why}`)
    this.name = 'StandbyNeverStarted'
  }
}

/** Standby containers waiting on an engine now (its numbers beside its active runs). */
export function standbysOn(engine: string): number {
  let count = 0
  for (const entry of standbys.values()) if (entry.engine === engine) count++
  return count
}

/** Takes a slot's standby out of the pool (to use or discard it). */
function removeStandby(slot: string): Waiting | undefined {
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
function discard({container, cli}: Pick<Waiting, 'container' | 'cli'>): void {
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
let standbyPreparation = sharedAbortController()

/**
 * Engine down: its standbys' docker clients are killed and their containers removed once it
 * answers again (before anything else starts there: removals.ts), never waited for now.
 */
onEngineDown((engine) => {
  for (const [slot, entry] of [...standbys]) {
    if (entry.engine !== engine) continue
    removeStandby(slot)
    entry.container.child.stdin?.destroy()
    signalChild(entry.container.child, 'SIGKILL')
    removeWhenEngineAnswers(entry.cli, entry.container.name, () => {})
  }
})

/**
 * Starts the slot's standby on `engine` unless it has one there (one waiting on another engine is
 * discarded): `prepare` readies what the container needs (its image, under the pool's signal) and
 * returns how to start it, called only if the slot is still free.
 */
export function prepareStandby(
  slot: string,
  cli: DockerCli,
  engine: string,
  prepare: (signal: AbortSignal) => Promise<(signal: AbortSignal) => Promise<AgentContainer>>,
  log: (line: string) => void,
): void {
  const preparation = standbyPreparation.signal
  const preparing = (async () => {
    if (standbys.get(slot)?.engine === engine || !standbysAllowed()) return
    const start = await prepare(preparation)
    if (standbys.get(slot)?.engine === engine || preparation.aborted || !standbysAllowed()) return
    const container = await start(preparation)
    // a stop, or another standby for the slot, may have come while the engine created it
    if (standbys.get(slot)?.engine === engine || preparation.aborted || !standbysAllowed()) {
      discard({container, cli})
      return
    }
    if (standbys.has(slot)) discard(removeStandby(slot)!)
    const discardIfWaiting = () => {
      if (standbys.get(slot)?.container === container) discard(removeStandby(slot)!)
    }
    // One that ends on its own (engine restart, killed) is only removed: the next run starts cold.
    void container.child.then(discardIfWaiting)
    // its processes are the engine's: what they hold is not measured from here
    const budgeted: BudgetedStandby = {level: 'container', evict: discardIfWaiting, residentBytes: () => undefined}
    standbys.set(slot, {container, cli, engine, budgeted})
    if (!admitStandby(budgeted)) discardIfWaiting()
  })()
  void track(
    preparingStandbys,
    preparing.catch((error: unknown) => {
      // stopped on purpose (shutdown, a config change): not a failure to report
      if (!preparation.aborted) log(`could not start a standby container: ${toGatewayError(error).message}`)
    }),
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
  standbyPreparation = sharedAbortController()
  if (done) return []
  const left = [...discarding].map((container) => container.name)
  for (const container of discarding) {
    signalChild(container.child, 'SIGKILL')
    givenUp.add(container)
  }
  giveUpRemovals()
  return [...new Set([...left, ...owedRemovalNames()])]
}
