import {startSubprocess} from '../../runtime/util/subprocess.js'

/**
 * Runs bwrap once with the namespace layer's options: undefined when it worked, else why, with
 * bwrap's own message. A module of its own, imported when needed: a start that finds the probe's
 * remembered success never loads execa (≈ 10 ms) nor node:child_process.
 */
export async function bwrapFailure(bwrap: string, argv: string[], timeoutMs: number): Promise<string | undefined> {
  const options = {env: {}, timeoutMs, killSignal: 'SIGKILL' as const}
  // no pipes (a third of the CPU of piped output, which a CLI start pays for): bwrap's own message
  // is only needed when it fails, and is read by running it once more then
  const first = await startSubprocess(bwrap, argv, {...options, stdio: 'ignore'})
  if (!first.failed) return undefined
  const again = await startSubprocess(bwrap, argv, {...options, stdio: ['ignore', 'ignore', 'pipe']})
  return again.stderr.trim().split('\n')[0] || first.message
}
