import {spawn, type ChildProcess, type StdioOptions} from 'node:child_process'
import os from 'node:os'

/**
 * A child process that is also the promise of its result, over node:child_process: what the
 * runtime used execa for, without its start-up (loading execa costs a CLI start ≈ 10 ms of CPU,
 * its first call ≈ 3 ms more, and `send` and `sandbox exec` pay both before their child starts).
 * The promise never rejects: a failed start, a deadline, a cancel and a full buffer are fields of
 * the result.
 */
export interface SubprocessResult {
  /** The exit status; undefined when the process did not start or a signal ended it. */
  exitCode?: number
  signal?: NodeJS.Signals
  /** Buffered output (when piped and buffered), one final newline stripped. */
  stdout: string
  stderr: string
  /** stdout and stderr interleaved as they came (with the `all` option). */
  all?: string
  /** The start's errno code (ENOENT: no such executable). */
  code?: string
  /** Did not start, was killed for a deadline, a cancel or its buffer, or exited non-zero. */
  failed: boolean
  timedOut: boolean
  isCanceled: boolean
  /** What happened, for a message: "exit 2", "killed by SIGTERM", "spawn docker ENOENT", ... */
  message: string
}

export type Subprocess = ChildProcess & PromiseLike<SubprocessResult>

export interface SubprocessOptions {
  /** The child's whole environment: nothing is inherited. */
  env: Record<string, string>
  cwd?: string
  /** One entry per descriptor from fd 0 (default: stdin ignored, stdout and stderr piped). */
  stdio?: StdioOptions
  /** Written to stdin, which is then closed (needs stdio[0] 'pipe'). */
  input?: string
  /**
   * Whether piped stdout/stderr are kept for the result (default both); a caller reading a stream
   * itself says false.
   */
  buffer?: {stdout?: boolean; stderr?: boolean}
  /** Also keep stdout and stderr interleaved as they came, in `all`. */
  all?: boolean
  /** Buffered bytes per stream beyond which the child is killed (default 64 MiB). */
  maxBuffer?: number
  /** Kill with `killSignal` after this long (timedOut). */
  timeoutMs?: number
  /** Kill with `killSignal` when aborted (isCanceled). */
  signal?: AbortSignal
  killSignal?: NodeJS.Signals
  /** SIGKILL this long after `killSignal`, if the child is still there. */
  forceKillAfterMs?: number
  /** Its own session and process group (setsid). */
  detached?: boolean
  /** Its CPU niceness (0 to 19), set as soon as it started: background work that must not slow what users wait for. */
  niceness?: number
}

const DEFAULT_MAX_BUFFER = 64 * 1024 * 1024

/** The niceness of walks over a run's files (hand-overs, removals): the agent that made them many pays, not the others. */
export const FILE_WALK_NICENESS = 19

export function startSubprocess(file: string, args: readonly string[], options: SubprocessOptions): Subprocess {
  const child = spawn(file, args, {
    env: options.env,
    cwd: options.cwd,
    stdio: options.stdio ?? ['ignore', 'pipe', 'pipe'],
    detached: options.detached,
  })
  if (options.niceness !== undefined && child.pid !== undefined) {
    try {
      os.setPriority(child.pid, options.niceness)
    } catch {
      // already gone: its result says how it ended
    }
  }
  const killSignal = options.killSignal ?? 'SIGTERM'
  const maxBuffer = options.maxBuffer ?? DEFAULT_MAX_BUFFER
  let timedOut = false
  let isCanceled = false
  let overflowed: string | undefined
  let forceKill: NodeJS.Timeout | undefined
  let settled = false
  const exited = () => child.exitCode !== null || child.signalCode !== null
  // a process the child started may hold the pipes open after the child is gone: closing our ends
  // brings the result (and SIGPIPE to a writer that goes on)
  const closePipes = () => child.stdio.forEach((stream) => stream?.destroy())
  /** Ends the call for a deadline, a cancel or a full buffer, whether or not the child itself is still there. */
  const end = (reason: () => void) => {
    if (settled || timedOut || isCanceled || overflowed) return
    reason()
    if (exited() || child.pid === undefined) return closePipes()
    signalChild(child, killSignal)
    if (options.forceKillAfterMs !== undefined && killSignal !== 'SIGKILL') {
      forceKill ??= setTimeout(() => !exited() && signalChild(child, 'SIGKILL'), options.forceKillAfterMs)
    }
  }

  const buffers = {stdout: [] as Buffer[], stderr: [] as Buffer[], all: [] as Buffer[]}
  for (const name of ['stdout', 'stderr'] as const) {
    const stream = child[name]
    if (!stream) continue
    stream.on('error', () => {}) // a broken pipe ends the stream; the result comes from the exit
    if (options.buffer?.[name] === false) continue
    let size = 0
    stream.on('data', (chunk: Buffer) => {
      if (overflowed) return
      size += chunk.length
      if (size > maxBuffer) end(() => (overflowed = `${name} exceeded ${maxBuffer} bytes`))
      else {
        buffers[name].push(chunk)
        if (options.all) buffers.all.push(chunk)
      }
    })
  }
  // EPIPE when the child exits without reading (stdin, extra pipes): what it did is in its exit status
  for (const stream of [child.stdin, ...child.stdio.slice(3)]) stream?.on('error', () => {})
  if (options.input !== undefined) child.stdin?.end(options.input)

  // killed, but what it started may hold the pipes: what they still carry is read for a second
  child.once('exit', () => {
    if (timedOut || isCanceled || overflowed) setTimeout(closePipes, 1000).unref()
  })
  const timer = options.timeoutMs === undefined ? undefined : setTimeout(() => end(() => (timedOut = true)), options.timeoutMs)
  const onAbort = () => end(() => (isCanceled = true))
  options.signal?.addEventListener('abort', onAbort, {once: true})
  if (options.signal?.aborted) onAbort()

  const result = new Promise<SubprocessResult>((resolve) => {
    const finish = (exitCode: number | null, signal: NodeJS.Signals | null, startError?: NodeJS.ErrnoException) => {
      settled = true
      clearTimeout(timer)
      clearTimeout(forceKill)
      options.signal?.removeEventListener('abort', onAbort)
      const text = (name: 'stdout' | 'stderr' | 'all') => stripFinalNewline(Buffer.concat(buffers[name]).toString('utf8'))
      const code = exitCode ?? undefined
      const message = startError
        ? startError.message
        : timedOut ? `timed out after ${options.timeoutMs} ms`
        : isCanceled ? 'cancelled'
        : overflowed ? overflowed
        : signal ? `killed by ${signal}` : `exit ${code}`
      resolve({
        exitCode: startError ? undefined : code,
        signal: signal ?? undefined,
        stdout: text('stdout'),
        stderr: text('stderr'),
        ...(options.all ? {all: text('all')} : {}),
        code: startError?.code,
        failed: Boolean(startError) || timedOut || isCanceled || Boolean(overflowed) || code !== 0,
        timedOut,
        isCanceled,
        message,
      })
    }
    child.on('error', (error: NodeJS.ErrnoException) => {
      // a failed start: no 'close' with a pid follows ('error' of a failed kill comes after the start and is ignored)
      if (child.pid === undefined) finish(null, null, error)
    })
    child.once('close', (exitCode, signal) => {
      if (child.pid !== undefined) finish(exitCode, signal)
    })
  })
  return Object.assign(child, {then: result.then.bind(result)}) as Subprocess
}

/**
 * Signals a child only if it started: Node 20's ChildProcess.kill() on a spawn that failed (ENOENT),
 * before its 'error' is emitted, calls kill(0, signal), which signals the caller's whole process
 * group (a cancelled `docker` call that was never found took down the test runner, and would a
 * gateway or the operator's shell job).
 */
export function signalChild(child: ChildProcess, signal: NodeJS.Signals): void {
  if (child.pid !== undefined) child.kill(signal)
}

function stripFinalNewline(text: string): string {
  if (text.endsWith('\r\n')) return text.slice(0, -2)
  return text.endsWith('\n') ? text.slice(0, -1) : text
}

/**
 * The signal an abort carries (`send` forwarding SIGINT / SIGTERM aborts with its name); undefined
 * for any other reason.
 */
export function abortSignalName(reason: unknown): NodeJS.Signals | undefined {
  return typeof reason === 'string' && /^SIG[A-Z]+$/.test(reason) ? (reason as NodeJS.Signals) : undefined
}
