import {dockerCli} from '../../sandbox/docker/cli.js'
import {removeContainers} from '../../sandbox/docker/containers.js'
import {toGatewayError} from '../util/errors.js'
import {reapAbandonedRuns} from './run-processes.js'

/** Bounded: a hung engine must not hold up a start-up. */
const CONTAINER_REMOVAL_TIMEOUT_MS = 10_000

/**
 * Start-up of `serve` and `send`: kills what runs of a crashed owner left (their keeper died too,
 * or never got to it), removes their cgroups, containers and private TMPDIRs, and says so.
 */
export async function reclaimAbandonedRuns(home: string, log?: (line: string) => void): Promise<void> {
  const reaped = await reapAbandonedRuns(home)
  if (reaped.runs.length > 0)
    log?.(`killed what ${reaped.runs.length} run(s) of a process that is gone left running: ${reaped.runs.join(', ')}`)
  if (reaped.tmpDirs.length > 0)
    log?.(`removed ${reaped.tmpDirs.length} stale run directory(ies): ${reaped.tmpDirs.join(', ')}`)
  for (const failure of reaped.failures)
    log?.(`could not remove what an abandoned run left (remove it by hand): ${failure}`)
  if (reaped.containers.length === 0) return
  try {
    await removeContainers(dockerCli(), reaped.containers, AbortSignal.timeout(CONTAINER_REMOVAL_TIMEOUT_MS))
    log?.(`removed ${reaped.containers.length} container(s) of those runs`)
  } catch (error) {
    log?.(
      `could not remove the containers ${reaped.containers.join(', ')} (container clean will): ${toGatewayError(error).message}`,
    )
  }
}
