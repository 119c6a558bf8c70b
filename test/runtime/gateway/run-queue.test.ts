import {describe, expect, it} from 'vitest'
import {RunQueue} from '../../../src/runtime/gateway/run-queue.js'
import {Backoff} from '../../../src/runtime/connectors/backoff.js'

function deferred() {
  let resolve!: () => void
  const promise = new Promise<void>((r) => (resolve = r))
  return {promise, resolve}
}

describe('RunQueue', () => {
  it('runs one job per agent at a time, in arrival order', async () => {
    const queue = new RunQueue({maxConcurrent: 4, queueLimit: 100})
    const order: number[] = []
    let concurrent = 0
    let maxSeen = 0
    for (let i = 0; i < 20; i++) {
      queue.submit('a', {
        run: async () => {
          concurrent++
          maxSeen = Math.max(maxSeen, concurrent)
          await new Promise((resolve) => setTimeout(resolve, Math.random() * 3))
          order.push(i)
          concurrent--
        },
        cancel: () => {},
      })
    }
    await queue.idle()
    expect(order).toEqual([...Array(20).keys()])
    expect(maxSeen).toBe(1)
  })

  it('runs different agents in parallel up to the global limit', async () => {
    const queue = new RunQueue({maxConcurrent: 2, queueLimit: 10})
    const gates = ['a', 'b', 'c'].map(() => deferred())
    const started: string[] = []
    for (const [index, agent] of ['a', 'b', 'c'].entries()) {
      queue.submit(agent, {run: async () => (started.push(agent), await gates[index]!.promise), cancel: () => {}})
    }
    await new Promise((resolve) => setTimeout(resolve, 5))
    expect(started).toEqual(['a', 'b'])
    expect(queue.running).toBe(2)
    gates[0]!.resolve()
    await new Promise((resolve) => setTimeout(resolve, 5))
    expect(started).toEqual(['a', 'b', 'c'])
    gates[1]!.resolve()
    gates[2]!.resolve()
    await queue.idle()
  })

  it('refuses past the per-agent bound without affecting other agents', async () => {
    const queue = new RunQueue({maxConcurrent: 4, queueLimit: 2})
    const gate = deferred()
    const job = {run: () => gate.promise, cancel: () => {}}
    expect(queue.submit('a', job)).toBe(true) // running
    expect(queue.submit('a', job)).toBe(true) // waiting 1
    expect(queue.submit('a', job)).toBe(true) // waiting 2
    expect(queue.submit('a', job)).toBe(false)
    expect(queue.submit('b', job)).toBe(true)
    gate.resolve()
    await queue.idle()
    expect(queue.submit('a', job)).toBe(true)
    await queue.idle()
  })

  it('cancels jobs that have not started and keeps the running one', async () => {
    const queue = new RunQueue({maxConcurrent: 1, queueLimit: 10})
    const gate = deferred()
    const events: string[] = []
    queue.submit('a', {
      run: async () => (events.push('ran 1'), await gate.promise),
      cancel: () => events.push('cancel 1'),
    })
    queue.submit('a', {run: async () => void events.push('ran 2'), cancel: () => events.push('cancel 2')})
    queue.submit('b', {run: async () => void events.push('ran 3'), cancel: () => events.push('cancel 3')})
    await new Promise((resolve) => setTimeout(resolve, 5))
    expect(queue.waiting).toBe(2)
    expect(queue.cancelWaiting()).toBe(2)
    gate.resolve()
    await queue.idle()
    expect(events).toEqual(['ran 1', 'cancel 2', 'cancel 3'])
  })

  it('keeps going after a job throws', async () => {
    const queue = new RunQueue({maxConcurrent: 1, queueLimit: 10})
    const ran: number[] = []
    queue.submit('a', {run: async () => Promise.reject(new Error('boom')), cancel: () => {}})
    queue.submit('a', {run: async () => void ran.push(2), cancel: () => {}})
    await queue.idle()
    expect(ran).toEqual([2])
  })
})

describe('Backoff', () => {
  it('doubles from 1 s to a 30 s cap and starts over after reset', () => {
    const backoff = new Backoff()
    expect(Array.from({length: 7}, () => backoff.next())).toEqual([1000, 2000, 4000, 8000, 16_000, 30_000, 30_000])
    backoff.reset()
    expect(backoff.next()).toBe(1000)
  })
})
