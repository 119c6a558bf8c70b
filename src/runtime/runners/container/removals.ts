import {dockerCli, type DockerCli} from '../../../sandbox/docker/cli.js'
import {removeContainers} from '../../../sandbox/docker/containers.js'
import {localEngineApi} from '../../../sandbox/docker/engine-api.js'
import {GatewayError, toGatewayError} from '../../util/errors.js'
import {reportEngineAnswered} from './engine-health.js'
import {ENGINE_PING_TIMEOUT_MS, stopWatchingEngine, watchEngine} from './engine-watch.js'
import {sharedAbortController} from '../../util/shared-abort.js'

/**
 * The engine's API (no docker process) when the run uses the default docker CLI on a local engine;
 * an injected CLI does everything.
 */
export const engineApiFor = (cli: DockerCli) => (cli === dockerCli() ? localEngineApi() : undefined)

/** Removals and container runs still going: `send`, shutdown and tests wait for them. */
const pendingRemovals = new Set<Promise<void>>()
const REMOVAL_RETRY_TIMEOUT_MS = 10_000
/** Containers whose removal is owed, by name: retried in the background until the engine answers. */
const owedRemovals = new Map<string, {cli: DockerCli; log: (line: string) => void}>()
/**
 * Aborts the removals in flight when stopping cannot wait for a hung engine (their docker clients
 * would hold the exit).
 */
let giveUp = sharedAbortController()

/** Keeps `work` in `pending` until it settles, so shutdown can wait for it. */
export function track(pending: Set<Promise<void>>, work: Promise<void>): Promise<void> {
  pending.add(work)
  void work.finally(() => pending.delete(work))
  return work
}

/** Work whose end the removals wait for: a run's container until it has exited and been removed. */
export function trackRemoval(work: Promise<void>): Promise<void> {
  return track(pendingRemovals, work)
}

export function scheduleRemoval(cli: DockerCli, name: string, log: (line: string) => void): Promise<void> {
  return trackRemoval(
    removeContainers(engineApiFor(cli) ?? cli, [name], giveUp.signal).catch((error: unknown) => {
      log(`could not remove container ${name} (retrying until the engine answers): ${toGatewayError(error).message}`)
      removeWhenEngineAnswers(cli, name, log)
    }),
  )
}

export function removeWhenEngineAnswers(cli: DockerCli, name: string, log: (line: string) => void): void {
  owedRemovals.set(name, {cli, log})
  watchEngineOwingRemovals(cli)
}

/** Watches the engine until it answers again, retrying the owed removals on each pass. */
export function watchEngineOwingRemovals(cli: DockerCli): void {
  watchEngine(cli, retryOwedRemovals)
}

/** Removes one owed container; throws while the engine does not answer. */
async function removeOwed(
  name: string,
  owed: {cli: DockerCli; log: (line: string) => void},
  timeoutMs: number,
): Promise<void> {
  await removeContainers(owed.cli, [name], AbortSignal.any([AbortSignal.timeout(timeoutMs), giveUp.signal]))
  owedRemovals.delete(name)
  reportEngineAnswered()
  owed.log(`the Docker engine answers again: removed container ${name}`)
}

/** One pass over the owed removals; the engine answering at all clears the problem /healthz shows. */
async function retryOwedRemovals(): Promise<boolean> {
  for (const [name, owed] of [...owedRemovals]) {
    try {
      await removeOwed(name, owed, REMOVAL_RETRY_TIMEOUT_MS)
    } catch {
      break // still no answer: the next pass tries again
    }
  }
  return owedRemovals.size === 0
}

/**
 * Before a run starts a container: what an earlier run left when its engine died or hung is
 * removed first, so it cannot go on working beside the new run. E_DOCKER_DOWN while it cannot be.
 */
export async function removeOwedContainers(cli: DockerCli): Promise<void> {
  for (const [name, owed] of [...owedRemovals]) {
    // another engine's debt does not hold this one (engines.ts)
    if (!sameEngine(owed.cli, cli)) continue
    try {
      await removeOwed(name, owed, ENGINE_PING_TIMEOUT_MS)
    } catch (error) {
      watchEngineOwingRemovals(cli)
      throw new GatewayError(
        'E_DOCKER_DOWN',
        `container ${name} of an earlier run is still to be removed and the Docker engine does not answer (${toGatewayError(error).message.split('\n')[0]}); nothing new is started there until it is`,
        {
          retryable: true,
          suggestions: ['check `timeout 10 docker info`; start or restart the engine: sudo systemctl restart docker'],
        },
      )
    }
  }
}

function sameEngine(a: DockerCli, b: DockerCli): boolean {
  return a === b || (a.bin === b.bin && (a.engineArgs ?? []).join('\0') === (b.engineArgs ?? []).join('\0'))
}

/** Owed removals now, when the engine was just found answering (the gateway's engine probe). */
export async function removeOwedContainersNow(): Promise<void> {
  await removeOwedContainers(dockerCli()).catch(() => {})
}

/** Containers whose removal waits for the engine to answer. */
export function owedRemovalNames(): string[] {
  return [...owedRemovals.keys()]
}

/** Aborts the removals in flight (the engine does not answer and the process cannot wait). */
export function giveUpRemovals(): void {
  giveUp.abort()
  giveUp = sharedAbortController()
}

/**
 * For a process about to exit (gateway shutdown): stops retrying owed removals and aborts the
 * docker calls in flight, whose clients would otherwise hold the exit while the engine hangs.
 * Returns the containers left for the next start-up (it removes containers whose owner is gone).
 */
export function abandonEngineWork(): string[] {
  stopWatchingEngine()
  giveUpRemovals()
  return owedRemovalNames()
}

/** Resolves when every container this process started has exited and been removed (for `send`, shutdown and tests). */
export async function containerRemovalsSettled(): Promise<void> {
  await Promise.all([...pendingRemovals])
}
