import os from 'node:os'
import type {LoadedConfig} from '../config/types.js'
import {loadConfigForCommand} from '../config/load.js'
import {newRunId, runMessage, type RunMessageResult} from '../runners/run-message.js'
import {reclaimAbandonedRuns} from '../run-lifecycle/reclaim-runs.js'

export interface SendOptions {
  loaded: LoadedConfig
  agentId: string
  channel: string
  content: string
  unrestricted?: boolean
  onLog?: (line: string) => void
  /** Aborted with 'SIGINT' / 'SIGTERM' when `send` receives it: forwarded to the run. */
  signal?: AbortSignal
}

/**
 * `send` when no gateway took the message: the config loaded here (and written on first use,
 * said on `notice`), then the whole run in this process.
 */
export async function sendOneShot(
  options: Omit<SendOptions, 'loaded'> & {configPath?: string; notice: (line: string) => void},
): Promise<RunMessageResult> {
  const {configPath, notice, ...rest} = options
  return sendMessage({...rest, loaded: loadConfigForCommand(configPath, notice)})
}

export async function sendMessage(options: SendOptions): Promise<RunMessageResult> {
  // What runs of a crashed owner left is reclaimed while this run starts (or after it, when it never did)
  let reclaimed: Promise<void> | undefined
  // a reclaim that fails is reported, never the run's failure: it runs while the run does
  const reclaim = () =>
    (reclaimed ??= reclaimAbandonedRuns(options.loaded.home, options.onLog).catch((error: unknown) =>
      options.onLog?.(`could not reclaim what abandoned runs left: ${(error as Error).message}`),
    ))
  const runId = newRunId()
  const user = os.userInfo().username
  try {
    return await runMessage({
      loaded: options.loaded,
      agentId: options.agentId,
      runId,
      unrestricted: options.unrestricted,
      onLog: options.onLog,
      signal: options.signal,
      onStarted: () => void reclaim(),
      message: {
        id: runId,
        connector: 'cli',
        channel_id: options.channel,
        user: {id: user, name: user},
        content: options.content,
      },
    })
  } finally {
    await reclaim()
  }
}
