import {KeyedQueue} from '../util/keyed-queue.js'

/** One accepted message waiting for its turn. */
export interface QueuedJob {
  /** Runs the job; the queue starts the agent's next one when the promise settles. */
  run(): Promise<void>
  /** Called instead of `run` when the job is dropped before it started: the gateway stopping, or its sender gave up. */
  cancel(reason: 'stopping' | 'withdrawn'): void
  /** Aborted when the sender gives up (`send` interrupted or gone): the job is dropped if it has not started. */
  withdrawn?: AbortSignal
}

export interface RunQueueOptions {
  /** Runs in flight across all agents. */
  maxConcurrent: number
  /** Jobs waiting per agent (the one running is not counted); past it `submit` refuses. */
  queueLimit: number
}

interface Accepted {
  job: QueuedJob
  controller: AbortController
  started: boolean
}

/**
 * The gateway's view of the shared KeyedQueue (per-agent FIFO under a global limit): adds the
 * per-agent bound that turns a burst into "busy" replies, dropping jobs that have not started
 * when the gateway stops, and a way to wait until everything accepted is done.
 */
export class RunQueue {
  private readonly keyed: KeyedQueue
  /** Per agent, the jobs accepted and not finished (the running one included). */
  private readonly accepted = new Map<string, Set<Accepted>>()
  private readonly jobs = new Set<Promise<void>>()
  private idleWaiters: Array<() => void> = []

  constructor(private readonly options: RunQueueOptions) {
    this.keyed = new KeyedQueue({concurrency: options.maxConcurrent})
  }

  /** Whether `submit` would take a job for the agent now. */
  hasRoom(agentId: string): boolean {
    // one may run, queueLimit may wait behind it
    return (this.accepted.get(agentId)?.size ?? 0) < this.options.queueLimit + 1
  }

  /** False when the agent's queue is full: the caller tells the sender to try again. */
  submit(agentId: string, job: QueuedJob): boolean {
    if (!this.hasRoom(agentId)) return false
    const mine = this.accepted.get(agentId) ?? new Set<Accepted>()
    const entry: Accepted = {job, controller: new AbortController(), started: false}
    mine.add(entry)
    this.accepted.set(agentId, mine)
    const done = this.keyed
      .run(
        agentId,
        async () => {
          entry.started = true
          await job.run()
        },
        {signal: entry.controller.signal},
      )
      .catch(() => {
        // cancelled while waiting (cancelWaiting already called job.cancel), or the job threw:
        // either way the agent's line goes on
      })
      .then(() => {
        mine.delete(entry)
        if (mine.size === 0 && this.accepted.get(agentId) === mine) this.accepted.delete(agentId)
        this.jobs.delete(done)
        this.notifyIfIdle()
      })
    this.jobs.add(done)
    const withdraw = () => {
      if (entry.started || entry.controller.signal.aborted) return
      entry.controller.abort()
      job.cancel('withdrawn')
    }
    job.withdrawn?.addEventListener('abort', withdraw, {once: true})
    if (job.withdrawn?.aborted) withdraw()
    void done.then(() => job.withdrawn?.removeEventListener('abort', withdraw))
    return true
  }

  get running(): number {
    return this.keyed.stats().running
  }

  get waiting(): number {
    let total = 0
    for (const agent of this.accepted.keys()) total += this.waitingFor(agent)
    return total
  }

  waitingFor(agentId: string): number {
    let count = 0
    for (const entry of this.accepted.get(agentId) ?? []) if (!entry.started) count++
    return count
  }

  /** Drops every job that has not started, calling its `cancel`. */
  cancelWaiting(): number {
    const dropped = [...this.accepted.values()].flatMap((entries) => [...entries].filter((entry) => !entry.started))
    for (const entry of dropped) {
      entry.controller.abort()
      entry.job.cancel('stopping')
    }
    return dropped.length
  }

  /** Resolves when nothing runs and nothing waits. */
  idle(): Promise<void> {
    if (this.jobs.size === 0) return Promise.resolve()
    return new Promise((resolve) => this.idleWaiters.push(resolve))
  }

  private notifyIfIdle(): void {
    if (this.jobs.size > 0) return
    const waiters = this.idleWaiters
    this.idleWaiters = []
    for (const resolve of waiters) resolve()
  }
}
