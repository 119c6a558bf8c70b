import {execFile, spawn} from 'node:child_process'
import {signalChild} from '../runtime/util/subprocess.js'

/**
 * Runs bwrap once with the namespace layer's options: undefined when it worked, else why, with
 * bwrap's own message. A module of its own, imported when needed: a start that finds the probe's
 * remembered success never loads node:child_process (≈ 4 ms with node:net and node:stream).
 */
export async function bwrapFailure(bwrap: string, argv: string[], timeoutMs: number): Promise<string | undefined> {
  // no pipes (a third of the CPU of execFile's, whose streams a CLI start pays for): bwrap's own
  // message is only needed when it fails, and is read by running it once more then
  const failure = await new Promise<string | undefined>((resolve) => {
    const child = spawn(bwrap, argv, {env: {}, stdio: 'ignore'})
    const deadline = setTimeout(() => {
      signalChild(child, 'SIGKILL')
      resolve(`timed out after ${timeoutMs / 1000} s`)
    }, timeoutMs)
    child.on('error', (error) => {
      clearTimeout(deadline)
      resolve(error.message)
    })
    child.on('exit', (code, signal) => {
      clearTimeout(deadline)
      resolve(code === 0 ? undefined : code === null ? `killed by ${signal}` : `exit ${code}`)
    })
  })
  if (failure === undefined) return undefined
  const stderr = await new Promise<string>((resolve) => {
    execFile(bwrap, argv, {timeout: timeoutMs, env: {}, encoding: 'utf8'}, (_error, _stdout, output) => resolve(String(output ?? '')))
  })
  return stderr.trim().split('\n')[0] || failure
}
