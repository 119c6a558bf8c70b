import fs from 'node:fs/promises'
import {GatewayError} from '../util/errors.js'
import {KeyedQueue} from '../util/keyed-queue.js'
import {FILE_WALK_NICENESS, startSubprocess} from '../util/subprocess.js'
import {backgroundWalkCgroup} from '../../sandbox/run-cgroup.js'

export interface Owner {
  uid: number
  gid: number
}

/** A hostile workspace can hold millions of entries: past this the run is refused, not waited for. */
const HANDOVER_TIMEOUT_MS = 120_000

/** One walk per workspace at a time: a second caller (a standby after a run) then finds it done. */
const handovers = new KeyedQueue({concurrency: Number.MAX_SAFE_INTEGER})
/** Workspaces whose walk in this process did not finish: the next one walks whatever the root says. */
const unfinished = new Set<string>()

/**
 * Before a run as the gateway's own uid (host sandbox, unrestricted, `sandbox exec|check`): a
 * container run left the workspace to its uid, and the sandbox's root has no capability to write
 * there, so a root gateway takes it back (which also marks the workspace root as no longer the
 * container's: the next container run walks it again).
 */
export function reclaimWorkspace(workspace: string, signal?: AbortSignal): Promise<void> {
  return handWorkspaceTo(
    workspace,
    {uid: process.getuid?.() ?? 0, gid: process.getgid?.() ?? 0},
    {purpose: "a run as the gateway's own user", signal},
  )
}

/**
 * A root gateway hands the whole workspace to `owner`: a container run's user, or back to the
 * gateway itself for a run as its uid, whose sandboxed root has no CAP_DAC_OVERRIDE/CAP_FOWNER and
 * so cannot write files another uid owns. GNU chown -R -P walks with openat and never follows a
 * symlink the agent planted; the kernel drops setuid/setgid bits of every file it re-owns. It runs
 * as an async child (with a deadline and the caller's cancel): the gateway answers meanwhile, at
 * idle CPU and I/O priority and in a background walk's cgroup (half a CPU, idle among its siblings),
 * so the agent with many files waits for them, not the other agents.
 *
 * The walk is skipped when the workspace root already has the owner. chown -R changes a directory
 * after its contents, so the root's owner changes only when a walk finished, and after that no
 * entry of another owner can appear: the owner's own runs cannot give files away (no CAP_CHOWN),
 * a run as the gateway's uid takes the workspace back first (the root changes owner), and what the
 * gateway writes there gets the root's owner (workspace/files.ts). A walk this process did not
 * finish is redone whatever the root says.
 */
export async function handWorkspaceTo(
  workspace: string,
  owner: Owner,
  options: {purpose: string; signal?: AbortSignal},
): Promise<void> {
  if (process.getuid?.() !== 0) return
  const root = await fs.realpath(workspace)
  await handovers.run(root, () => handOver(root, owner, options), {signal: options.signal})
}

async function handOver(root: string, owner: Owner, options: {purpose: string; signal?: AbortSignal}): Promise<void> {
  const before = await fs.lstat(root)
  if (before.uid === owner.uid && before.gid === owner.gid && !unfinished.has(root)) return
  unfinished.add(root)
  const cgroup = backgroundWalkCgroup()
  const result = await Promise.resolve(
    startSubprocess('chown', ['-R', '-P', '-h', `${owner.uid}:${owner.gid}`, '--', root], {
      env: {PATH: process.env.PATH ?? '/usr/bin:/bin', LC_ALL: 'C'},
      timeoutMs: HANDOVER_TIMEOUT_MS,
      signal: options.signal,
      killSignal: 'SIGKILL',
      niceness: FILE_WALK_NICENESS,
      idle: true,
      cgroups: cgroup.dirs,
      maxBuffer: 1024 * 1024,
    }),
  ).finally(cgroup.remove)
  if (!result.failed) {
    unfinished.delete(root)
    return
  }
  const why = result.timedOut
    ? `it took longer than ${HANDOVER_TIMEOUT_MS / 1000} s`
    : result.isCanceled
      ? 'the run was cancelled'
      : result.stderr.trim().split('\n').slice(-3).join(' | ') || result.message
  throw new GatewayError(
    'E_WORKSPACE',
    `cannot hand the workspace ${root} to uid ${owner.uid} for ${options.purpose}: ${why}`,
    {
      retryable: result.isCanceled,
      suggestions: result.timedOut
        ? [
            `remove files from ${root} (a workspace with millions of entries cannot be handed over in time)`,
            `or chown -R -P ${owner.uid}:${owner.gid} ${root} by hand`,
          ]
        : ['check that `chown` (coreutils) is installed', `or chown -R -P ${owner.uid}:${owner.gid} ${root} by hand`],
    },
  )
}
