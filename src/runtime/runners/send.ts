import os from 'node:os'
import {GatewayError} from '../util/errors.js'
import type {LoadedConfig} from '../config/types.js'
import {newRunId, runMessage, type RunMessageResult} from './run-message.js'
import {reclaimAbandonedRuns} from './reclaim-runs.js'

/** The signals `send` forwards to its run (Ctrl-C, kill), and the exit status of a run they end. */
export const FORWARDED_SIGNALS = ['SIGINT', 'SIGTERM'] as const
export function signalExitCode(signal: string): number {
  return signal === 'SIGINT' ? 130 : 143
}

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
 * `MESSAGE` or `-` for stdin; an empty message is a usage error, not a wasted LLM call. stdin is
 * a getter: Node sets up process.stdin on first access (≈ 1.5 ms), which only `-` needs.
 */
export async function readMessageArgument(argument: string, stdin: () => NodeJS.ReadableStream): Promise<string> {
  let content = argument
  if (argument === '-') {
    const chunks: Buffer[] = []
    for await (const chunk of stdin()) chunks.push(Buffer.isBuffer(chunk) ? chunk : Buffer.from(chunk))
    content = Buffer.concat(chunks).toString('utf8')
  }
  if (!content.trim()) throw new GatewayError('E_USAGE', 'the message is empty', {suggestions: ['pass the message as an argument, or "-" to read it from stdin']})
  return content.trim()
}

export async function sendMessage(options: SendOptions): Promise<RunMessageResult> {
  // What runs of a crashed owner left is reclaimed while this run starts (or after it, when it never did)
  let reclaimed: Promise<void> | undefined
  // a reclaim that fails is reported, never the run's failure: it runs while the run does
  const reclaim = () =>
    (reclaimed ??= reclaimAbandonedRuns(options.loaded.home, options.onLog).catch((error: unknown) => options.onLog?.(`could not reclaim what abandoned runs left: ${(error as Error).message}`)))
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
      message: {id: runId, connector: 'cli', channel_id: options.channel, user: {id: user, name: user}, content: options.content},
    })
  } finally {
    await reclaim()
  }
}
