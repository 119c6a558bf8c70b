import {execa} from 'execa'
import path from 'node:path'
import type {AgentRunInput, AgentRunOutput} from '../agent-run/contract.js'
import {failure, parseAgentRunOutput} from '../agent-run/output.js'
import {APP_ROOT} from '../app-root.js'
import {killProcessTree} from '../../sandbox/kill-session.js'


/** argv that starts `meepagateway agent-run` with this Node; always the built app (tests build it first). */
export function agentRunArgv(): string[] {
  return [process.execPath, path.join(APP_ROOT, 'bin', 'run.js'), 'agent-run']
}

export interface AgentProcessOptions {
  /** Full argv; argv[0] is the executable. */
  argv: string[]
  /** The complete environment of the child: nothing is inherited. */
  env: Record<string, string>
  cwd: string
  input: AgentRunInput
  timeoutMs: number
  signal?: AbortSignal
  /** Extra data written to fd 3 (the sandbox helper reads its rules there). */
  fd3?: string
  onStderr?: (line: string) => void
}

const STDERR_TAIL_BYTES = 4096

/**
 * Starts agent-run (directly or under a sandbox helper) in its own process group and kills the
 * whole group at the deadline and after exit, so nothing it started outlives the run.
 */
export async function runAgentProcess(options: AgentProcessOptions): Promise<AgentRunOutput> {
  const {input} = options
  const [file, ...args] = options.argv
  if (!file) throw new Error('runAgentProcess: empty argv')
  const child = execa(file, args, {
    cwd: options.cwd,
    env: options.env,
    extendEnv: false,
    detached: true,
    input: JSON.stringify(input),
    stdio: options.fd3 === undefined ? ['pipe', 'pipe', 'pipe'] : ['pipe', 'pipe', 'pipe', 'pipe'],
    reject: false,
    stripFinalNewline: true,
    maxBuffer: 64 * 1024 * 1024,
    cancelSignal: options.signal,
  })
  if (options.fd3 !== undefined) {
    const fd3 = child.stdio[3] as NodeJS.WritableStream
    fd3.end(options.fd3)
  }

  let stderrTail = ''
  child.stderr?.on('data', (chunk: Buffer) => {
    const text = chunk.toString('utf8')
    stderrTail = (stderrTail + text).slice(-STDERR_TAIL_BYTES)
    if (options.onStderr) for (const line of text.split('\n')) if (line.trim()) options.onStderr(line)
  })

  // `detached` made the child a session leader: members that moved to another process group
  // (the host sandbox lets them setpgid, never setsid) are still in its session
  const killGroup = () => killProcessTree(child.pid)

  let timedOut = false
  const timer = setTimeout(() => {
    timedOut = true
    killGroup()
  }, options.timeoutMs)
  const result = await child
  clearTimeout(timer)
  killGroup() // background processes the agent left running die with the run

  if (timedOut) {
    return failure(input.run_id, 'E_TIMEOUT', `the run took longer than ${Math.round(options.timeoutMs / 1000)} s and was stopped`, false, {stderr_tail: stderrTail})
  }
  if (result.isCanceled) return failure(input.run_id, 'E_RUN', 'the run was cancelled', true)
  return parseAgentRunOutput(input.run_id, String(result.stdout ?? ''), result.exitCode, stderrTail)
}
