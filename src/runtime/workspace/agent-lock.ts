import fs from 'node:fs/promises'
import os from 'node:os'
import path from 'node:path'
import {GatewayError} from '../util/errors.js'
import {processAlive} from '../util/process-alive.js'
import {makeHomeDirectories} from '../util/make-directories.js'

const POLL_MS = 100

/**
 * One run per agent across processes: `send` and a running gateway (or two `send`s) must not run
 * the same agent at once, since its workspace and memory.db are not safe for concurrent runs.
 * In-process ordering is the KeyedQueue's job; this lock file (outside the workspace, so the agent
 * cannot touch it) covers other processes. A lock whose owner process is gone is taken over.
 */
export async function withAgentLock<T>(
  home: string,
  agentId: string,
  use: () => Promise<T>,
  options: {signal?: AbortSignal; waitMs?: number; onWait?: (ownerPid: number) => void} = {},
): Promise<T> {
  return withHomeLock(home, `agent-${agentId}`, agentId, use, options)
}

/**
 * The same lock for another of an agent's concerns, `name` in the home's locks/ (its workspace
 * volume's making and mounting: workspace/volume.ts), held by one process at a time.
 */
export async function withHomeLock<T>(
  home: string,
  name: string,
  agentId: string,
  use: () => Promise<T>,
  options: {signal?: AbortSignal; waitMs?: number; onWait?: (ownerPid: number) => void} = {},
): Promise<T> {
  const dir = path.join(home, 'locks')
  makeHomeDirectories(dir, home)
  const file = path.join(dir, `${name}.lock`)
  const deadline = Date.now() + (options.waitMs ?? 15 * 60_000)
  let told = false
  for (;;) {
    if (options.signal?.aborted)
      throw new GatewayError('E_RUN', 'the run was cancelled while it waited for its turn', {retryable: true})
    const owner = await tryAcquire(file)
    if (owner === undefined) break
    if (!told) options.onWait?.(owner)
    told = true
    if (Date.now() > deadline) {
      throw new GatewayError(
        'E_BUSY',
        `agent ${agentId} is busy with another run (process ${owner}) and did not become free in time`,
        {
          retryable: true,
          suggestions: ['try again when the current message is answered'],
        },
      )
    }
    await new Promise((resolve) => setTimeout(resolve, POLL_MS))
  }
  try {
    return await use()
  } finally {
    await fs.rm(file, {force: true})
  }
}

/** Takes the lock (undefined) or returns the pid of the live process that holds it. */
async function tryAcquire(file: string): Promise<number | undefined> {
  let handle: fs.FileHandle
  try {
    handle = await fs.open(file, 'wx', 0o600)
  } catch (error) {
    if ((error as NodeJS.ErrnoException).code !== 'EEXIST') throw error
    return lockOwner(file)
  }
  try {
    await handle.writeFile(`${process.pid} ${os.hostname()}\n`)
    await handle.close()
    return undefined
  } catch (error) {
    // (a full disk) an empty lock left behind reads as one being written: every later run would wait for it
    await handle.close().catch(() => undefined)
    await fs.rm(file, {force: true})
    throw error
  }
}

/** The pid of the live process holding the lock (-1: unknown), or undefined once a dead owner's lock is taken. */
async function lockOwner(file: string): Promise<number | undefined> {
  const content = await fs.readFile(file, 'utf8').catch(() => '')
  const [pidText, host] = content.trim().split(' ')
  const pid = Number(pidText)
  // An empty file is a lock being written right now; a lock from another host cannot be checked.
  if (!content || host !== os.hostname() || (Number.isInteger(pid) && pid > 0 && processAlive(pid))) return pid || -1
  // The owner died without unlocking (crash, SIGKILL). Re-read right before removing, so a lock
  // another waiter just took over is not removed (the window left is a few microseconds).
  if ((await fs.readFile(file, 'utf8').catch(() => '')) === content) await fs.rm(file, {force: true})
  return tryAcquire(file)
}
