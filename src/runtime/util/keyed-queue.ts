import {GatewayError} from './errors.js'

export interface KeyedQueueOptions {
  /** At most this many tasks run at once over all keys. */
  concurrency: number
  /** At most this many tasks wait (not yet running) over all keys; past it `run` throws E_BUSY. */
  maxPending?: number
}

export interface RunOptions {
  /** Aborting while the task still waits takes it out of the queue (rejects with E_RUN, retryable). */
  signal?: AbortSignal
}

/**
 * Tasks with the same key run one after the other, in arrival order; tasks with different keys
 * run in parallel up to a global limit. The gateway keys by agent id: one message per agent at a
 * time (an agent's workspace and memory are not safe for concurrent runs), different agents side
 * by side. Also used to build each image once when several runs need it at the same moment.
 */
export class KeyedQueue {
  private concurrency: number
  private readonly maxPending: number
  private running = 0
  private pending = 0
  private readonly slotWaiters: Array<() => void> = []
  /** Per key, a promise that settles when the key's last queued task is done. */
  private readonly tails = new Map<string, Promise<void>>()

  constructor(options: KeyedQueueOptions) {
    this.concurrency = checkedLimit(options.concurrency)
    this.maxPending = options.maxPending ?? Number.POSITIVE_INFINITY
  }

  /** Changes the global limit (config reload); running tasks are not affected. */
  setConcurrency(concurrency: number): void {
    this.concurrency = checkedLimit(concurrency)
    this.wakeSlotWaiters()
  }

  stats(): {running: number; pending: number; keys: number} {
    return {running: this.running, pending: this.pending, keys: this.tails.size}
  }

  async run<T>(key: string, task: () => Promise<T>, options: RunOptions = {}): Promise<T> {
    if (this.pending >= this.maxPending) {
      throw new GatewayError('E_BUSY', `too many messages are waiting (${this.pending}); try again shortly`, {
        retryable: true,
      })
    }
    if (options.signal?.aborted) throw cancelled()
    const previous = this.tails.get(key) ?? Promise.resolve()
    let done!: () => void
    const mine = new Promise<void>((resolve) => (done = resolve))
    // The next task of this key waits for the previous one AND this one, even if this one is
    // abandoned while waiting, so order is kept.
    const tail = previous.then(() => mine)
    this.tails.set(key, tail)
    this.pending++
    let pendingCounted = true
    const leavePending = () => {
      if (pendingCounted) this.pending--
      pendingCounted = false
    }
    try {
      await abortable(previous, options.signal)
      await this.acquireSlot(options.signal)
      leavePending()
      try {
        return await task()
      } finally {
        this.releaseSlot()
      }
    } finally {
      leavePending()
      done()
      if (this.tails.get(key) === tail) this.tails.delete(key)
    }
  }

  private async acquireSlot(signal?: AbortSignal): Promise<void> {
    while (this.running >= this.concurrency) {
      let wake!: () => void
      const woken = new Promise<void>((resolve) => (wake = resolve))
      this.slotWaiters.push(wake)
      try {
        await abortable(woken, signal)
      } catch (error) {
        const index = this.slotWaiters.indexOf(wake)
        if (index >= 0) this.slotWaiters.splice(index, 1)
        throw error
      }
    }
    this.running++
  }

  private releaseSlot(): void {
    this.running--
    this.wakeSlotWaiters()
  }

  private wakeSlotWaiters(): void {
    let free = this.concurrency - this.running
    while (free-- > 0 && this.slotWaiters.length > 0) this.slotWaiters.shift()?.()
  }
}

function checkedLimit(value: number): number {
  if (!Number.isInteger(value) || value < 1)
    throw new GatewayError('E_CONFIG', `a concurrency limit must be a whole number of at least 1, not ${value}`)
  return value
}

function cancelled(): GatewayError {
  return new GatewayError('E_RUN', 'the run was cancelled while it waited for its turn', {retryable: true})
}

async function abortable(promise: Promise<void>, signal?: AbortSignal): Promise<void> {
  if (!signal) return promise
  if (signal.aborted) throw cancelled()
  let onAbort!: () => void
  const aborted = new Promise<never>((_, reject) => {
    onAbort = () => reject(cancelled())
    signal.addEventListener('abort', onAbort, {once: true})
  })
  try {
    await Promise.race([promise, aborted])
  } finally {
    signal.removeEventListener('abort', onAbort)
  }
}
