import type {DockerCli} from '../../../sandbox/docker/cli.js'
import {dockerEngineProblem, reportEngineAnswered} from './engine-health.js'

/** How long asking the engine whether it still answers (`docker version`) may take. */
export const ENGINE_PING_TIMEOUT_MS = 3_000
/** How often an engine that stopped answering is asked again while this process runs. */
const WATCH_PASS_MS = 2_000

/** Whether the engine answers `docker version` within ENGINE_PING_TIMEOUT_MS. */
export function engineAnswers(cli: DockerCli): Promise<boolean> {
  return cli.exec(['version', '--format', '{{.Server.Version}}'], {timeoutMs: ENGINE_PING_TIMEOUT_MS}).then(
    (result) => result.exitCode === 0,
    () => false,
  )
}

/** One pass over the work owed to the engine (removals); resolves true once nothing is owed. */
export type OwedWork = () => Promise<boolean>

let nextPass: NodeJS.Timeout | undefined

/**
 * Keeps asking the engine (the owed work first, else `docker version`) until it answers again;
 * its answering clears the problem /healthz shows.
 */
export function watchEngine(cli: DockerCli, owed: OwedWork): void {
  nextPass ??= setTimeout(() => void watchPass(cli, owed), WATCH_PASS_MS).unref()
}

async function watchPass(cli: DockerCli, owed: OwedWork): Promise<void> {
  const settled = await owed()
  if (settled && dockerEngineProblem() && (await engineAnswers(cli))) reportEngineAnswered()
  nextPass = undefined
  if (!settled || dockerEngineProblem()) watchEngine(cli, owed)
}

/** Stops asking (a process about to exit). */
export function stopWatchingEngine(): void {
  clearTimeout(nextPass)
  nextPass = undefined
}
