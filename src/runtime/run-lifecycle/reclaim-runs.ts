import {credentialFreeConfigDir, DockerCli, dockerCli} from '../../sandbox/docker/cli.js'
import {removeContainers} from '../../sandbox/docker/containers.js'
import {toGatewayError} from '../util/errors.js'
import {forgetRunProcess, reapAbandonedRuns, type ReapResult} from './run-processes.js'
import {removeWholeFile} from '../util/write-whole-file.js'

/** Bounded: a hung engine must not hold up a start-up. */
const CONTAINER_REMOVAL_TIMEOUT_MS = 10_000
/** How often a listed engine that did not answer at start-up is asked again to remove what it holds. */
const ENGINE_RETRY_MS = 2_000

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
  const local = reaped.containers.filter((container) => !container.engine).map((container) => container.name)
  for (const container of reaped.containers) if (container.engine) void reclaimOnEngine(home, container, log)
  if (local.length === 0) return
  try {
    await removeContainers(dockerCli(), local, AbortSignal.timeout(CONTAINER_REMOVAL_TIMEOUT_MS))
    log?.(`removed ${local.length} container(s) of those runs`)
  } catch (error) {
    log?.(
      `could not remove the containers ${local.join(', ')} (container clean will): ${toGatewayError(error).message}`,
    )
  }
}

/**
 * A crashed run's container on an engine of the `engines:` list: removed there, now or as soon as
 * that engine answers (asked again every 2 s while this process runs; its record stays for the
 * next start-up until then). What the agent's volume there holds is unknown: the next run there
 * copies the workspace whole.
 */
async function reclaimOnEngine(
  home: string,
  container: ReapResult['containers'][number],
  log?: (line: string) => void,
): Promise<void> {
  const engine = container.engine!
  // for good: a record back after a crash would be trusted over a volume the dead run changed
  if (engine.syncState) removeWholeFile(engine.syncState)
  const cli = new DockerCli({engineArgs: engine.args, configDir: credentialFreeConfigDir(home)})
  for (let attempt = 0; ; attempt++) {
    try {
      await removeContainers(cli, [container.name], AbortSignal.timeout(CONTAINER_REMOVAL_TIMEOUT_MS))
      forgetRunProcess(home, container.runId)
      log?.(`removed container ${container.name} of run ${container.runId} from engine ${engine.name}`)
      return
    } catch (error) {
      if (attempt === 0)
        log?.(
          `could not remove container ${container.name} of run ${container.runId} from engine ${engine.name} (removed when it answers): ${toGatewayError(error).message.split('\n')[0]}`,
        )
      await new Promise((resolve) => setTimeout(resolve, ENGINE_RETRY_MS).unref())
    }
  }
}
