import {spawn, type ChildProcess} from 'node:child_process'
import fs from 'node:fs'
import path from 'node:path'
import type {Duplex, Writable} from 'node:stream'
import type {AgentRunInput, AgentRunOutput} from '../shapes/agent-run-contract.js'
import {failure, parseAgentRunOutput} from '../agent-run/output.js'
import {APP_ROOT} from '../util/app-root.js'
import type {LimitsConfig} from '../config/types.js'
import {sizeBytes} from '../config/size.js'
import {diskFull, diskUsage, heldByDeletedFiles, overLimit, watchDiskUsage, type DiskUsage} from './disk-limit.js'
import {forgetRunProcess, recordRunProcess} from './run-processes.js'
import {killProcessTree} from '../util/process-tree.js'
import {abortSignalName, signalChild} from '../util/subprocess.js'
import {keeperArgv, keeperHelper, keeperJoined, onKeeperDeadline, setKeeperDeadline} from '../../sandbox/keeper.js'
import {
  cgroupPids,
  cgroupSupport,
  createRunCgroup,
  killRunCgroups,
  removeRunCgroups,
  type RunCgroup,
} from '../../sandbox/run-cgroup.js'
import {AgentRunChannel, type HostLlm} from '../llm-channel/host.js'
import {DeadlineWatch} from './deadline-watch.js'

/** argv that starts `meepagateway agent-run` with this Node; always the built app (tests build it first). */
export function agentRunArgv(): string[] {
  return [process.execPath, path.join(APP_ROOT, 'bin', 'run.js'), 'agent-run']
}

/** Who owns the run on the host: its record in gateway.db, its limits, its workspace and private TMPDIR. */
export interface RunOwnership {
  home: string
  runId: string
  limits: LimitsConfig
  workspace: string
  tmpDir: string
}

/** How agent-run is started: everything but the message it will get. */
export interface AgentProcessLaunch {
  /** Full argv; argv[0] is the executable. */
  argv: string[]
  /** The complete environment of the child: nothing is inherited. */
  env: Record<string, string>
  cwd: string
  /** Extra data written to fd 3 (the sandbox helper reads its rules there). */
  fd3?: string
  /** Where agent-run's stderr lines go until a run takes the process (then to that run's onStderr). */
  onStderr?: (line: string) => void
  /** With it (Linux, helper built), the run gets a keeper, a cgroup and a record in gateway.db. */
  ownership?: RunOwnership
  /**
   * The command starts no process before it has its input (agent-run itself, or under the Landlock
   * helper; bwrap forks at once): the keeper may then move it into the run's cgroups while it
   * starts, and the input waits until it has.
   */
  quietUntilInput?: boolean
}

/** One message for a started agent-run. */
export interface AgentProcessRun {
  input: AgentRunInput
  /** Answers agent-run's LLM requests (the channel on its stdin/stdout). */
  llm: HostLlm
  /** Counted from the moment the run is given its input. */
  timeoutMs: number
  /** Aborting ends the run; a reason such as 'SIGINT' or 'SIGTERM' is first forwarded to it. */
  signal?: AbortSignal
  onStderr?: (line: string) => void
  /** Called once agent-run is started and has its input (or will get none): work that must not hold up the run. */
  onStarted?: () => void
}

export type AgentProcessOptions = AgentProcessLaunch & AgentProcessRun

const STDERR_TAIL_BYTES = 4096
/** What one run may put in the gateway's log from its stderr: a run flooding it must not fill the operator's disk. */
const STDERR_LOG_MAX_BYTES = 256 * 1024

/** `log`, until `maxBytes` of lines went through it; then one line saying the rest is dropped. */
export function cappedLog(log: (line: string) => void, maxBytes = STDERR_LOG_MAX_BYTES): (line: string) => void {
  let used = 0
  return (line) => {
    if (used > maxBytes) return
    used += line.length + 1
    log(used > maxBytes ? `agent-run wrote more than ${maxBytes} bytes on stderr; the rest is not logged` : line)
  }
}
/** The operator hears once per process that this host cannot enforce the cgroup limits. */
let toldLimitsUnenforced = false
/** A run told to stop (SIGINT/SIGTERM forwarded) gets this long before it is killed. */
const FORWARDED_SIGNAL_GRACE_MS = 1000
/** The keeper gets this long to kill the run and exit before it is killed itself. */
const KEEPER_GRACE_MS = 2000
/** An agent-run that lingers after its result (it should exit at once) gets this long. */
const RESULT_EXIT_GRACE_MS = 1000

/**
 * Starts agent-run (directly or under a sandbox helper) under its keeper, which kills every
 * process of the run when agent-run exits, at the deadline, and when this process dies; without
 * a keeper (no helper built, macOS) the child leads its own session and the group is killed.
 */
export async function runAgentProcess(options: AgentProcessOptions): Promise<AgentRunOutput> {
  let started: StartedAgentProcess
  try {
    started = startAgentProcess(options)
  } catch (error) {
    return failure(options.input.run_id, 'E_SANDBOX', (error as Error).message, false)
  }
  return started.run(options)
}

interface DiskLimit {
  limit: string
  bytes: number
  roots: string[]
  workspace: string
}

/**
 * An agent-run process started and waiting for its input (agent-run reads nothing before it),
 * already under its keeper and in its cgroups: `run` gives it one message, once; `discard` ends
 * it unused. A gateway keeps one ready per agent so a message does not wait for Node to start.
 * Throws (E_SANDBOX's message) when the run's cgroups cannot be made.
 */
export function startAgentProcess(launch: AgentProcessLaunch): StartedAgentProcess {
  return new StartedAgentProcess(launch)
}

export class StartedAgentProcess {
  private readonly child: ChildProcess
  private readonly closed: Promise<{exitCode?: number; signal?: NodeJS.Signals}>
  private readonly cgroup: RunCgroup | undefined
  private readonly disk: DiskLimit | undefined
  /**
   * The keeper's lifeline: closing our end tells the keeper to kill the run; it reads the deadline
   * there and writes 'J' and 'T'.
   */
  private readonly lifeline: Duplex | undefined
  private readonly joined: Promise<boolean>
  private readonly helper: string | undefined
  private stderrTail = ''
  private logStderr: ((line: string) => void) | undefined
  private fallback: NodeJS.Timeout | undefined
  private exited = false
  /** This process killed the keeper itself (it did not end the run in time): not a kill from outside. */
  private keeperKilled = false
  private taken = false

  constructor(private readonly launch: AgentProcessLaunch) {
    const {ownership} = launch
    this.helper = ownership ? keeperHelper() : undefined
    let argv = launch.argv
    const keeperFd = launch.fd3 === undefined ? 3 : 4
    const joinWhileStarting = Boolean(this.helper && launch.quietUntilInput)
    this.disk = ownership && {
      limit: ownership.limits.disk,
      bytes: sizeBytes(ownership.limits.disk, 'limits.disk'),
      roots: [ownership.workspace, ownership.tmpDir],
      workspace: ownership.workspace,
    }
    if (ownership && this.helper) {
      this.cgroup = createRunCgroup(ownership.runId, {
        memoryBytes: sizeBytes(ownership.limits.memory, 'limits.memory'),
        pids: ownership.limits.pids,
        cpus: ownership.limits.cpus,
      })
      if (!this.cgroup && !toldLimitsUnenforced) {
        toldLimitsUnenforced = true
        launch.onStderr?.(
          `limits.memory, limits.pids and limits.cpus are NOT enforced on this host: ${cgroupSupport().how}`,
        )
      }
      argv = keeperArgv(
        this.helper,
        keeperFd,
        {
          cgroups: this.cgroup?.dirs ?? [],
          joinWhileStarting,
          maxFileSize: this.disk?.bytes,
          removeDir: ownership.tmpDir,
        },
        argv,
      )
      // before the spawn: a crash from here on leaves cgroups only the record names (the keeper's pid follows)
      recordRunProcess(
        ownership.home,
        {runId: ownership.runId, cgroups: this.cgroup?.dirs ?? [], tmpDir: ownership.tmpDir},
        launch.onStderr,
      )
    }
    const [file, ...args] = argv
    const extraFds = (launch.fd3 === undefined ? 0 : 1) + (this.helper ? 1 : 0)
    try {
      if (!file) throw new Error('startAgentProcess: empty argv')
      // node:child_process, not execa: its option handling and result machinery cost every run ≈ 5 ms
      this.child = spawn(file, args, {
        cwd: launch.cwd,
        env: launch.env,
        detached: true,
        stdio: Array<'pipe'>(3 + extraFds).fill('pipe'),
      })
    } catch (error) {
      this.release()
      throw error
    }
    this.closed = childClosed(this.child)
    void this.closed.then(() => (this.exited = true))
    if (launch.fd3 !== undefined) {
      const fd3 = this.child.stdio[3] as Writable
      fd3.on('error', () => {}) // a helper that exits without reading its rules fails the run on its own
      fd3.end(launch.fd3)
    }
    this.lifeline = this.helper ? (this.child.stdio[keeperFd] as Duplex) : undefined
    this.lifeline?.on('error', () => {})
    this.logStderr = launch.onStderr && cappedLog(launch.onStderr)
    this.child.stderr?.on('error', () => {})
    this.child.stderr?.on('data', (chunk: Buffer) => {
      const text = chunk.toString('utf8')
      this.stderrTail = (this.stderrTail + text).slice(-STDERR_TAIL_BYTES)
      if (this.logStderr) for (const line of text.split('\n')) if (line.trim()) this.logStderr(line)
    })
    // the keeper moves agent-run into its cgroups while it starts (it starts nothing before its input)
    this.joined = joinWhileStarting && this.lifeline ? keeperJoined(this.lifeline) : Promise.resolve(true)
    // from here the keeper kills the run and removes its cgroups if this process dies; the record
    // covers the keeper dying too
    if (ownership && this.helper && this.child.pid) {
      recordRunProcess(
        ownership.home,
        {runId: ownership.runId, keeperPid: this.child.pid, cgroups: this.cgroup?.dirs ?? [], tmpDir: ownership.tmpDir},
        launch.onStderr,
      )
    }
  }

  /** Still waiting for a message: started, not exited, not taken. */
  get ready(): boolean {
    return !this.exited && !this.taken
  }

  /**
   * Why this waiting agent-run cannot take a message: it, its keeper or its cgroups were killed or
   * removed while it waited. Read from /proc and the cgroups now, not from exit events this process
   * may not have handled yet. undefined: whole (or, `started` false, still starting: no agent-run
   * in its cgroups yet, but its keeper and processes alive).
   */
  idleFault(started: boolean): string | undefined {
    if (this.taken) return 'it was already given a message'
    const pid = this.child.pid
    if (this.exited || pid === undefined || !liveProcess(pid))
      return `its ${this.lifeline ? 'keeper' : 'process'}${pid === undefined ? '' : ` (${pid})`} is gone`
    if (!this.cgroup) return undefined
    for (const dir of this.cgroup.dirs) {
      if (!fs.existsSync(path.join(dir, 'cgroup.procs'))) return `its cgroup ${dir} is gone`
      const members = cgroupPids(dir).filter(liveProcess)
      if (members.length === 0) return `no process is left in its cgroup ${dir}`
      if (started && !members.some(isAgentRun)) return `its agent-run is no longer in its cgroup ${dir}`
    }
    return undefined
  }

  /** Resident memory of the run's processes (its cgroups', else agent-run's process), in bytes. */
  residentBytes(): number {
    const pids = this.cgroup ? new Set(this.cgroup.dirs.flatMap(cgroupPids)) : [this.child.pid ?? 0]
    let bytes = 0
    for (const pid of pids) {
      try {
        bytes += Number(/VmRSS:\s+(\d+) kB/.exec(fs.readFileSync(`/proc/${pid}/status`, 'utf8'))?.[1] ?? 0) * 1024
      } catch {
        // ended meanwhile
      }
    }
    return bytes
  }

  /** Whether its processes are in cgroups of its own (where agent-run is looked for). */
  get hasCgroups(): boolean {
    return this.cgroup !== undefined
  }

  /** The pid of agent-run itself in the run's cgroups (undefined: not started yet, or no cgroups here). */
  agentRunPid(): number | undefined {
    return this.cgroup?.dirs.flatMap(cgroupPids).find((pid) => liveProcess(pid) && isAgentRun(pid))
  }

  // Without a keeper, `detached` made the child a session leader: members that moved to another
  // process group (the host sandbox lets them setpgid, never setsid) are still in its session.
  private readonly killRun = (): void => {
    if (!this.lifeline) return killProcessTree(this.child.pid)
    this.lifeline.destroy()
    this.fallback ??= setTimeout(() => {
      this.keeperKilled = true
      signalChild(this.child, 'SIGKILL')
      if (this.cgroup) killRunCgroups(this.cgroup.dirs)
    }, KEEPER_GRACE_MS)
  }

  /** Ends it unused (with everything it started), its cgroups and record gone. */
  async discard(): Promise<void> {
    this.taken = true
    this.killRun()
    await this.closed
    clearTimeout(this.fallback)
    if (!this.lifeline) killProcessTree(this.child.pid)
    this.release()
  }

  private release(): void {
    if (this.cgroup) {
      killRunCgroups(this.cgroup.dirs)
      removeRunCgroups(this.cgroup.dirs)
    }
    if (this.launch.ownership && this.helper) forgetRunProcess(this.launch.ownership.home, this.launch.ownership.runId)
  }

  /** Gives agent-run its one message and serves its LLM channel until it ends; never throws. */
  async run(options: AgentProcessRun): Promise<AgentRunOutput> {
    if (this.taken) throw new Error('StartedAgentProcess.run: this agent-run was already given a message')
    this.taken = true
    try {
      return await this.serve(options)
    } finally {
      this.release()
    }
  }

  private async serve(options: AgentProcessRun): Promise<AgentRunOutput> {
    const {input} = options
    const {child, cgroup, disk, killRun} = this
    if (options.onStderr) this.logStderr = cappedLog(options.onStderr)
    // the limits count from the message: a standby's waiting time is not the run's
    const oomBefore = cgroup?.oomKills() ?? 0
    const pidsHitsBefore = cgroup?.pidsLimitHits() ?? 0

    // Before the input: limits.disk is checked (over it already, the run is stopped before it
    // gets its input), and the keeper has moved agent-run into its cgroups.
    let fullBefore: DiskUsage | undefined
    const diskChecked = disk
      ? diskUsage(disk.roots, disk.bytes).then((usage) => {
          if (!overLimit(usage, disk.bytes)) return true
          fullBefore = usage
          killRun()
          return false
        })
      : Promise.resolve(true)
    const inputAllowed = Promise.all([diskChecked, this.joined]).then(
      (ready) => ready.every(Boolean),
      () => (killRun(), false),
    )
    // An agent-run that lingers after its result (it should exit at once) is not waited for.
    const channel = new AgentRunChannel(
      child.stdin!,
      child.stdout!,
      input,
      options.llm,
      killRun,
      () => setTimeout(killRun, RESULT_EXIT_GRACE_MS).unref(),
      inputAllowed,
    )
    void inputAllowed.then(() => options.onStarted?.())

    // the keeper ends the run at the deadline on its own too: this process may be stopped then
    const deadline = new DeadlineWatch(options.timeoutMs, killRun)
    if (this.lifeline) {
      setKeeperDeadline(this.lifeline, options.timeoutMs)
      onKeeperDeadline(this.lifeline, deadline.passed)
    }
    let cancelled: string | undefined
    let grace: NodeJS.Timeout | undefined
    const onAbort = () => {
      const reason: unknown = options.signal?.reason
      cancelled = abortSignalName(reason) ?? 'abort'
      if (cancelled === 'abort' || grace) return killRun()
      // The run hears the signal first (as if it had been sent to it), and is killed if it lingers.
      signalChild(child, cancelled as NodeJS.Signals)
      grace = setTimeout(killRun, FORWARDED_SIGNAL_GRACE_MS)
    }
    options.signal?.addEventListener('abort', onAbort)
    if (options.signal?.aborted) onAbort()
    let diskOver = false
    let usageWhenOver: DiskUsage = {bytes: 0}
    // space in files the run unlinked but keeps open counts too: its processes are the cgroup's members
    const runPids = () => (cgroup?.dirs ?? []).flatMap(cgroupPids)
    const diskWatch = disk
      ? watchDiskUsage(
          disk.roots,
          disk.bytes,
          (usage) => {
            diskOver = true
            usageWhenOver = usage
            killRun()
          },
          cgroup ? () => heldByDeletedFiles([...new Set(runPids())], disk.roots) : undefined,
        )
      : undefined
    const result = await this.closed
    const diskAtEnd = await diskWatch?.stop()
    deadline.stop()
    clearTimeout(grace)
    clearTimeout(this.fallback)
    options.signal?.removeEventListener('abort', onAbort)
    await channel.settled()
    channel.close()
    // background processes the agent left running die with the run (the keeper did it already)
    if (!this.lifeline) killProcessTree(child.pid)
    const stderrTail = this.stderrTail

    if (disk && fullBefore !== undefined)
      return diskFull(input.run_id, disk.limit, fullBefore, disk.workspace, 'before')
    if (deadline.reached) {
      // its answer may have come while this process was stopped: it is the run's, on time
      const answer = deadline.suspendedMs !== undefined ? channel.outcome() : undefined
      return (
        answer ??
        deadline.failure(input.run_id, (seconds) => `the run took longer than ${seconds} s and was stopped`, {
          stderr_tail: stderrTail,
        })
      )
    }
    if (cancelled) {
      return failure(
        input.run_id,
        'E_RUN',
        `the run was cancelled${cancelled === 'abort' ? '' : ` (${cancelled})`}`,
        true,
        {
          ...(result.exitCode === undefined ? {} : {exit_code: result.exitCode}),
          ...(cancelled === 'abort' ? {} : {signal: cancelled}),
        },
      )
    }
    if (disk && diskAtEnd && (diskOver || diskAtEnd.over))
      return diskFull(
        input.run_id,
        disk.limit,
        diskAtEnd.over ? diskAtEnd.usage : usageWhenOver,
        disk.workspace,
        'during',
      )
    const limits = this.launch.ownership?.limits
    if (cgroup && limits) {
      const oomKills = cgroup.oomKills() - oomBefore
      if (oomKills > 0) {
        return failure(
          input.run_id,
          'E_OOM',
          `the run ran out of memory: it reached limits.memory (${limits.memory}) and the kernel killed ${oomKills} of its processes`,
          false,
          {
            oom_kills: oomKills,
            stderr_tail: stderrTail,
            suggestions: ['raise limits.memory for this agent', 'or ask for a task that needs less memory'],
          },
        )
      }
      const pidsHits = cgroup.pidsLimitHits() - pidsHitsBefore
      if (pidsHits > 0) {
        return failure(
          input.run_id,
          'E_LIMIT',
          `the run reached limits.pids (${limits.pids} processes and threads): ${pidsHits} fork(s) were refused, and every process of the run was stopped`,
          false,
          {
            pids_limit_hits: pidsHits,
            suggestions: ['raise limits.pids for this agent if its work needs that many processes'],
          },
        )
      }
    }
    const outcome = channel.outcome()
    if (!outcome && this.lifeline && result.signal && !this.keeperKilled) {
      return failure(
        input.run_id,
        'E_RUN',
        `the run's keeper (process ${child.pid}) was killed by ${result.signal} from outside the gateway, and its run ended with it`,
        false,
        {
          keeper_signal: result.signal,
          stderr_tail: stderrTail,
        },
      )
    }
    return outcome ?? parseAgentRunOutput(input.run_id, '', result.exitCode, stderrTail)
  }
}

/** A process that has not exited (a zombie has: it only waits to be reaped). */
function liveProcess(pid: number): boolean {
  try {
    const stat = fs.readFileSync(`/proc/${pid}/stat`, 'utf8')
    return !/^[ZX]/.test(stat.slice(stat.lastIndexOf(')') + 2))
  } catch {
    return false
  }
}

/** Whether the process is agent-run itself (its exact argv), not its keeper, bwrap or the helper. */
function isAgentRun(pid: number): boolean {
  try {
    return fs.readFileSync(`/proc/${pid}/cmdline`, 'utf8') === `${agentRunArgv().join('\0')}\0`
  } catch {
    return false
  }
}

/**
 * The child's end, once it exited and its pipes closed (its last output is read): the exit code,
 * undefined when a signal ended it or it never started (that error is the run's failure to report).
 */
function childClosed(child: ChildProcess): Promise<{exitCode?: number; signal?: NodeJS.Signals}> {
  child.on('error', () => {}) // a failed start or kill: what the run reports comes from its end
  return new Promise((resolve) =>
    child.once('close', (code, signal) =>
      resolve({exitCode: child.pid === undefined || code === null ? undefined : code, ...(signal ? {signal} : {})}),
    ),
  )
}
