import {dockerCli} from '../../../sandbox/docker/cli.js'
import {localEngineApi} from '../../../sandbox/docker/engine-api.js'
import {toGatewayError} from '../../util/errors.js'
import {noteEngineVersion, reportEngineAnswered, reportEngineProblem} from './engine-health.js'
import {LOCAL_ENGINE} from './engines.js'

/** A ping the engine has not answered by then counts as hung: /healthz must not wait on it. */
const ENGINE_PROBE_TIMEOUT_MS = 3_000

/**
 * Asks the Docker engine whether it answers (over its socket where it is local, else `docker
 * version`) and tells /healthz (engine-health.ts) without waiting for a run to find out. An engine
 * that answers again first gets the containers owed a removal removed.
 */
export async function probeEngine(signal?: AbortSignal): Promise<void> {
  try {
    const version = await (localEngineApi() ?? dockerCli()).ping({timeoutMs: ENGINE_PROBE_TIMEOUT_MS, signal})
    noteEngineVersion(LOCAL_ENGINE, version.server)
  } catch (error) {
    if (!signal?.aborted) reportEngineProblem(toGatewayError(error).message.split('\n')[0] ?? 'no answer')
    return
  }
  reportEngineAnswered()
  await (await import('./removals.js')).removeOwedContainersNow()
}
