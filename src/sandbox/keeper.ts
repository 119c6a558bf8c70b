import fs from 'node:fs'
import type {Readable, Writable} from 'node:stream'
import {helperPath} from './landlock/helper-path.js'

/**
 * The keeper (native/meepa-sandbox.c, --keeper-fd): the process a run's owner starts. It forks the
 * run, stays small, and kills every process of the run (its cgroups, its session, every descendant)
 * when the run's main process exits, at the run's deadline, or when the owner dies, which it learns
 * from a hang-up on an fd the owner holds open. It never touches stdin/stdout: they go straight to the run.
 */

/** The keeper, when this host has it: meepa-sandbox, Linux only. */
export function keeperHelper(): string | undefined {
  if (process.platform !== 'linux') return undefined
  try {
    fs.accessSync(helperPath(), fs.constants.X_OK)
    return helperPath()
  } catch {
    return undefined
  }
}

export interface KeeperOptions {
  /** The run's cgroup directories: its processes join them before anything runs. */
  cgroups?: string[]
  /**
   * The keeper moves the run into its cgroups while the command starts, not before, and then
   * writes 'J' on the keeper fd: a cgroup v1 migration waits 5-15 ms for an RCU grace period, which
   * Node's own start-up then hides. Only for a command that starts no process before it gets work,
   * and the owner gives it none before the 'J' (see keeperJoined).
   */
  joinWhileStarting?: boolean
  /** RLIMIT_FSIZE of the run: no file it writes grows past this. */
  maxFileSize?: number
  /** Removed by the keeper when the owner died (the run's private TMPDIR). */
  removeDir?: string
  /** argv the keeper runs when the owner died (after killing the run), e.g. `docker rm --force NAME`. */
  onOrphan?: string[]
}

/**
 * `meepa-sandbox --keeper-fd K ... -- ARGV`, or, when ARGV is itself the helper applying rules,
 * one helper doing both (no second exec). The keeper is the owner-facing process whatever runs
 * under it (the helper, bwrap, agent-run, docker).
 */
export function keeperArgv(helper: string, keeperFd: number, options: KeeperOptions, argv: string[]): string[] {
  const flags = ['--keeper-fd', String(keeperFd)]
  for (const dir of options.cgroups ?? []) flags.push('--cgroup', dir)
  if (options.joinWhileStarting) flags.push('--join-while-starting')
  if (options.maxFileSize) flags.push('--max-file-size', String(options.maxFileSize))
  if (options.removeDir) flags.push('--remove-dir', options.removeDir)
  for (const arg of options.onOrphan ?? []) flags.push('--on-orphan', arg)
  if (argv[0] === helper && argv[1] === '--rules-fd') return [helper, ...flags, ...argv.slice(1)]
  return [helper, ...flags, '--', ...argv]
}

/**
 * Resolves once the keeper (started with joinWhileStarting) wrote 'J' on its fd: the run is whole
 * in its cgroups. false when the fd ended first: the keeper died or could not join (its stderr says why).
 */
export function keeperJoined(keeperFd: Readable): Promise<boolean> {
  return new Promise((resolve) => {
    const done = (joined: boolean) => {
      keeperFd.off('data', onData)
      keeperFd.off('end', onEnd)
      keeperFd.off('close', onEnd)
      resolve(joined)
    }
    const onData = (chunk: Buffer) => {
      if (chunk.includes(0x4a)) done(true)
    }
    const onEnd = () => done(false)
    keeperFd.on('data', onData)
    keeperFd.once('end', onEnd)
    keeperFd.once('close', onEnd)
  })
}

/**
 * Gives the keeper the run's deadline, `ms` from now: it then ends the run (and runs its
 * --on-orphan command) at that moment of its own monotonic clock, even while this process is
 * stopped (SIGSTOP) or gone, and says 'T' on its fd (see onKeeperDeadline).
 */
export function setKeeperDeadline(keeperFd: Writable, ms: number): void {
  keeperFd.write(`D${Math.max(0, Math.ceil(ms))}\n`)
}

/** Calls `onDeadline` once the keeper says ('T') that it ended the run at its deadline. */
export function onKeeperDeadline(keeperFd: Readable, onDeadline: () => void): void {
  const onData = (chunk: Buffer) => {
    if (!chunk.includes(0x54)) return
    keeperFd.off('data', onData)
    onDeadline()
  }
  keeperFd.on('data', onData)
}
