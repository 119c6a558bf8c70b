import {execa} from 'execa'
import path from 'node:path'
import type {AgentRunInput, AgentRunOutput} from '../agent-run/contract.js'
import {failure, parseAgentRunOutput} from '../agent-run/output.js'
import {APP_ROOT} from '../app-root.js'
import {killProcessTree} from '../../sandbox/kill-session.js'
import {AgentRunChannel, type HostLlm} from './llm-channel.js'


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
  /** Answers agent-run's LLM requests (the channel on its stdin/stdout). */
  llm: HostLlm
  timeoutMs: number
  signal?: AbortSignal
  /** Extra data written to fd 3 (the sandbox helper reads its rules there). */
  fd3?: string
  onStderr?: (line: string) => void
}

const STDERR_TAIL_BYTES = 4096
const RESULT_EXIT_GRACE_MS = 1000

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
    stdio: options.fd3 === undefined ? ['pipe', 'pipe', 'pipe'] : ['pipe', 'pipe', 'pipe', 'pipe'],
    // stdout is the LLM channel, read as it comes (AgentRunChannel), never buffered whole
    buffer: {stdout: false},
    reject: false,
    stripFinalNewline: true,
    maxBuffer: 64 * 1024 * 1024,
    cancelSignal: options.signal,
  })
  if (options.fd3 !== undefined) {
    const fd3 = child.stdio[3] as NodeJS.WritableStream
    fd3.end(options.fd3)
  }

  // `detached` made the child a session leader: members that moved to another process group
  // (the host sandbox lets them setpgid, never setsid) are still in its session
  const killGroup = () => killProcessTree(child.pid)
  // An agent-run that lingers after its result (it should exit at once) is not waited for.
  const channel = new AgentRunChannel(child.stdin!, child.stdout!, input, options.llm, killGroup, () => setTimeout(killGroup, RESULT_EXIT_GRACE_MS).unref())

  let stderrTail = ''
  child.stderr?.on('data', (chunk: Buffer) => {
    const text = chunk.toString('utf8')
    stderrTail = (stderrTail + text).slice(-STDERR_TAIL_BYTES)
    if (options.onStderr) for (const line of text.split('\n')) if (line.trim()) options.onStderr(line)
  })

  let timedOut = false
  const timer = setTimeout(() => {
    timedOut = true
    killGroup()
  }, options.timeoutMs)
  const result = await child
  clearTimeout(timer)
  await channel.settled()
  channel.close()
  killGroup() // background processes the agent left running die with the run

  if (timedOut) {
    return failure(input.run_id, 'E_TIMEOUT', `the run took longer than ${Math.round(options.timeoutMs / 1000)} s and was stopped`, false, {stderr_tail: stderrTail})
  }
  if (result.isCanceled) return failure(input.run_id, 'E_RUN', 'the run was cancelled', true)
  return channel.outcome() ?? parseAgentRunOutput(input.run_id, '', result.exitCode, stderrTail)
}
