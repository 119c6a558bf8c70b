import os from 'node:os'
import {GatewayError} from './errors.js'
import type {LoadedConfig} from './config/types.js'
import {newRunId, runMessage, type RunMessageResult} from './run-message.js'

export interface SendOptions {
  loaded: LoadedConfig
  agentId: string
  channel: string
  content: string
  unrestricted?: boolean
  onLog?: (line: string) => void
}

/** `MESSAGE` or `-` for stdin; an empty message is a usage error, not a wasted LLM call. */
export async function readMessageArgument(argument: string, stdin: NodeJS.ReadableStream): Promise<string> {
  let content = argument
  if (argument === '-') {
    const chunks: Buffer[] = []
    for await (const chunk of stdin) chunks.push(Buffer.isBuffer(chunk) ? chunk : Buffer.from(chunk))
    content = Buffer.concat(chunks).toString('utf8')
  }
  if (!content.trim()) throw new GatewayError('E_USAGE', 'the message is empty', {suggestions: ['pass the message as an argument, or "-" to read it from stdin']})
  return content.trim()
}

export async function sendMessage(options: SendOptions): Promise<RunMessageResult> {
  const runId = newRunId()
  const user = os.userInfo().username
  return runMessage({
    loaded: options.loaded,
    agentId: options.agentId,
    runId,
    unrestricted: options.unrestricted,
    onLog: options.onLog,
    message: {id: runId, connector: 'cli', channel_id: options.channel, user: {id: user, name: user}, content: options.content},
  })
}
