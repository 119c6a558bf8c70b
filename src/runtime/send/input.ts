import {GatewayError} from '../util/errors.js'

/** The signals `send` forwards to its run (Ctrl-C, kill), and the exit status of a run they end. */
export const FORWARDED_SIGNALS = ['SIGINT', 'SIGTERM'] as const
export function signalExitCode(signal: string): number {
  return signal === 'SIGINT' ? 130 : 143
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
  if (!content.trim())
    throw new GatewayError('E_USAGE', 'the message is empty', {
      suggestions: ['pass the message as an argument, or "-" to read it from stdin'],
    })
  return content.trim()
}
