import type {ChildProcess, StdioOptions} from 'node:child_process'
import fs from 'node:fs'
import os from 'node:os'
import path from 'node:path'
import {execa, type Options, type Result} from 'execa'

/**
 * The runtime's one way to start a short-lived child (the docker CLI, the sandbox helper's probe,
 * `sandbox exec`, the agent's shell tool): execa with the options every caller needs said once.
 * The promise never rejects (execa's `reject: false`): a failed start, a deadline, a cancel and a
 * full buffer are fields of the result. What execa leaves to us: a process the child started may
 * hold its pipes open after the child is gone, and execa waits for them; after a deadline, a
 * cancel or a full buffer they are closed here so the call ends.
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
  input?: string | Buffer
  /**
   * Whether piped stdout/stderr are kept for the result (default both); a caller reading a stream
   * itself says false.
   */
  buffer?: {stdout?: boolean; stderr?: boolean}
  /** Also keep stdout and stderr interleaved as they came, in `all`. */
  all?: boolean
  /** Buffered characters per stream beyond which the child is killed (default 64 MiB). */
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
  /**
   * It gets the CPUs and the disk only when no other work wants them: SCHED_IDLE and the idle I/O
   * class, through util-linux `chrt` and `ionice` found on `env.PATH` (each execs the next, so the
   * child keeps its pid and argv; a missing command is then ionice's exit 127, not ENOENT). Where
   * they are missing, `niceness` alone holds.
   */
  idle?: boolean
  /** cgroup directories it is moved into as soon as it started (where that fails, it stays in ours). */
  cgroups?: readonly string[]
}

/**
 * The niceness of walks over a run's files (hand-overs, removals): the agent that made them many
 * pays, not the others.
 */
export const FILE_WALK_NICENESS = 19

const DEFAULT_MAX_BUFFER = 64 * 1024 * 1024
/** How long what a killed child left running may still write to its pipes before they are closed. */
const DRAIN_AFTER_KILL_MS = 1000

export function startSubprocess(file: string, args: readonly string[], options: SubprocessOptions): Subprocess {
  const stdio = options.stdio ?? ['ignore', 'pipe', 'pipe']
  const maxBuffer = options.maxBuffer ?? DEFAULT_MAX_BUFFER
  const cut = new AbortController()
  const wrapper = options.idle ? idleWrapper(options.env.PATH) : []
  const subprocess = execa(wrapper[0] ?? file, wrapper.length > 0 ? [...wrapper.slice(1), file, ...args] : args, {
    env: options.env,
    extendEnv: false,
    cwd: options.cwd,
    stdio,
    detached: options.detached,
    // a descriptor past stderr (a keeper's lifeline, the helper's rules) is the caller's to use, never read here
    buffer: {
      stdout: options.buffer?.stdout ?? true,
      stderr: options.buffer?.stderr ?? true,
      ...extraDescriptors(stdio, false),
    },
    all: options.all,
    maxBuffer,
    // the deadline and the cancel reach execa only once the child exists (startedOnly below)
    cancelSignal: cut.signal,
    killSignal: options.killSignal ?? 'SIGTERM',
    forceKillAfterDelay: options.forceKillAfterMs ?? false,
    encoding: 'utf8',
    stripFinalNewline: true,
    reject: false,
    // ours to end: a gateway's children are ended by its own shutdown, and a cancelled CLI forwards its signal
    cleanup: false,
  } as Options)
  const child = subprocess as unknown as ChildProcess
  const deadline = startedOnly(child, options, cut)
  if (options.niceness !== undefined && child.pid !== undefined) {
    try {
      os.setPriority(child.pid, options.niceness)
    } catch {
      // already gone: its result says how it ended
    }
  }
  if (child.pid !== undefined)
    for (const dir of options.cgroups ?? [])
      try {
        fs.writeFileSync(path.join(dir, 'cgroup.procs'), String(child.pid))
      } catch {
        // already gone, or the cgroup is: it runs where it is
      }
  // a start that failed (ENOENT) is told by the child's 'error', even when a deadline or a cancel came first
  let startError: NodeJS.ErrnoException | undefined
  child.once('error', (error: NodeJS.ErrnoException) => {
    if (child.pid === undefined) startError = error
  })
  closePipesOnceCutOff(child, options, maxBuffer)
  if (options.input !== undefined) child.stdin?.end(options.input)
  const result = Promise.resolve(subprocess).then((raw) =>
    resultOf(raw, startError, options, maxBuffer, deadline.passed),
  )
  for (const method of ['then', 'catch', 'finally'] as const) {
    Reflect.defineProperty(child, method, {value: result[method].bind(result), configurable: true, writable: true})
  }
  return child as unknown as Subprocess
}

/**
 * SCHED_IDLE rather than niceness 19 alone: a CPU running only SCHED_IDLE work counts as idle when
 * the scheduler places a waking task, so other agents' processes take it at once.
 */
function idleWrapper(searchPath: string | undefined): string[] {
  const found = (name: string) =>
    (searchPath ?? '').split(':').some((dir) => dir !== '' && fs.existsSync(path.join(dir, name)))
  return found('chrt') && found('ionice') ? ['chrt', '--idle', '0', 'ionice', '--class', '3'] : []
}

/**
 * The deadline and the cancel, for a child that started only: execa ends a child with
 * ChildProcess.kill(), which on Node 20, for a spawn that failed (ENOENT) before its 'error' came,
 * signals the caller's whole process group (see signalChild).
 */
function startedOnly(child: ChildProcess, options: SubprocessOptions, cut: AbortController): {passed: boolean} {
  const deadline = {passed: false}
  if (child.pid === undefined) return deadline
  const cancel = () => cut.abort()
  const timer =
    options.timeoutMs === undefined
      ? undefined
      : setTimeout(() => {
          deadline.passed = true
          cut.abort()
        }, options.timeoutMs)
  options.signal?.addEventListener('abort', cancel, {once: true})
  if (options.signal?.aborted) cancel()
  // 'close', not 'exit': a process the child left may hold its pipes, and the deadline holds for them too
  child.once('close', () => {
    clearTimeout(timer)
    options.signal?.removeEventListener('abort', cancel)
  })
  return deadline
}

/**
 * After a deadline, a cancel or a full buffer the call ends even when a process the child started
 * holds the pipes: what they still carry is read for a second after the child is gone, then our
 * ends are closed (which ends execa's wait, and sends SIGPIPE to a writer that goes on).
 */
function closePipesOnceCutOff(child: ChildProcess, options: SubprocessOptions, maxBuffer: number): void {
  for (const stream of child.stdio) stream?.on('error', () => {}) // EPIPE, a reset: the result comes from the exit
  let cutOff = false
  const closePipes = () => child.stdio.forEach((stream) => stream?.destroy())
  const exited = () => child.exitCode !== null || child.signalCode !== null || child.pid === undefined
  const onCutOff = () => {
    if (cutOff) return
    cutOff = true
    if (exited()) setTimeout(closePipes, DRAIN_AFTER_KILL_MS).unref()
    else child.once('exit', () => setTimeout(closePipes, DRAIN_AFTER_KILL_MS).unref())
  }
  const done = () => {
    clearTimeout(deadline)
    options.signal?.removeEventListener('abort', onCutOff)
  }
  const deadline = options.timeoutMs === undefined ? undefined : setTimeout(onCutOff, options.timeoutMs)
  options.signal?.addEventListener('abort', onCutOff, {once: true})
  if (options.signal?.aborted) onCutOff()
  for (const name of ['stdout', 'stderr'] as const) {
    // a streamed one is its reader's to bound (and to pause: counting it here would cut it off)
    if (options.buffer?.[name] === false) continue
    let size = 0
    child[name]?.on('data', (chunk: string | Buffer) => {
      size += chunk.length
      if (size > maxBuffer) onCutOff()
    })
  }
  child.once('close', done)
  child.once('error', done)
}

function resultOf(
  raw: Result,
  startError: NodeJS.ErrnoException | undefined,
  options: SubprocessOptions,
  maxBuffer: number,
  /** The deadline passed (execa saw only a cancel: the deadline is ours, see startedOnly). */
  timedOut: boolean,
): SubprocessResult {
  const failure = raw as Result & {message?: string; isMaxBuffer?: boolean}
  // execa names the stream in its message only ("Command's stdout was larger than …")
  const overflowed = failure.isMaxBuffer
    ? `${/Command's (\w+) was larger/.exec(failure.message ?? '')?.[1] ?? 'output'} exceeded ${maxBuffer} characters`
    : undefined
  const message = startError
    ? startError.message
    : timedOut
      ? `timed out after ${options.timeoutMs} ms`
      : raw.isCanceled
        ? 'cancelled'
        : (overflowed ?? (raw.signal ? `killed by ${raw.signal}` : `exit ${raw.exitCode}`))
  return {
    exitCode: startError ? undefined : raw.exitCode,
    signal: raw.signal as NodeJS.Signals | undefined,
    stdout: text(raw.stdout),
    stderr: text(raw.stderr),
    ...(options.all ? {all: text(raw.all)} : {}),
    code: startError?.code,
    failed: raw.failed || timedOut,
    timedOut,
    isCanceled: raw.isCanceled && !timedOut,
    message,
  }
}

/** `{fd3: value, ...}`: execa's per-descriptor form of an option, for each descriptor past stderr. */
function extraDescriptors<T>(stdio: StdioOptions, value: T): Record<string, T> {
  return Array.isArray(stdio) ? Object.fromEntries(stdio.slice(3).map((_, index) => [`fd${index + 3}`, value])) : {}
}

const text = (value: unknown): string => (typeof value === 'string' ? value : '')

/**
 * Signals a child only if it started: Node 20's ChildProcess.kill() on a spawn that failed (ENOENT),
 * before its 'error' is emitted, calls kill(0, signal), which signals the caller's whole process
 * group (a cancelled `docker` call that was never found took down the test runner, and would a
 * gateway or the operator's shell job).
 */
export function signalChild(child: ChildProcess, signal: NodeJS.Signals): void {
  if (child.pid !== undefined) child.kill(signal)
}

/**
 * The signal an abort carries (`send` forwarding SIGINT / SIGTERM aborts with its name); undefined
 * for any other reason.
 */
export function abortSignalName(reason: unknown): NodeJS.Signals | undefined {
  return typeof reason === 'string' && /^SIG[A-Z]+$/.test(reason) ? (reason as NodeJS.Signals) : undefined
}
