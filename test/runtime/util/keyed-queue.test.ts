import fs from 'node:fs'
import os from 'node:os'
import path from 'node:path'
import {describe, expect, it} from 'vitest'
import {withAgentLock} from '../../../src/runtime/workspace/agent-lock.js'
import {KeyedQueue} from '../../../src/runtime/util/keyed-queue.js'

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms))

/** Runs a task that records when it started and ended. */
function recorder() {
  const spans: Array<{key: string; start: number; end: number}> = []
  const task =
    (key: string, ms = 40) =>
    async () => {
      const start = Date.now()
      await sleep(ms)
      spans.push({key, start, end: Date.now()})
      return key
    }
  const overlap = (a: string, b: string) => {
    const x = spans.find((span) => span.key === a)!
    const y = spans.find((span) => span.key === b)!
    return x.start < y.end && y.start < x.end
  }
  return {spans, task, overlap}
}

describe('KeyedQueue', () => {
  it('runs tasks of one key one after the other, in arrival order', async () => {
    const queue = new KeyedQueue({concurrency: 4})
    const {spans, task, overlap} = recorder()
    await Promise.all([queue.run('a', task('a1')), queue.run('a', task('a2')), queue.run('a', task('a3'))])
    expect(spans.map((span) => span.key)).toEqual(['a1', 'a2', 'a3'])
    expect(overlap('a1', 'a2') || overlap('a2', 'a3')).toBe(false)
  })

  it('runs different keys at the same time, up to the global limit', async () => {
    const queue = new KeyedQueue({concurrency: 2})
    const {task, overlap} = recorder()
    let peak = 0
    const watch = setInterval(() => (peak = Math.max(peak, queue.stats().running)), 2)
    await Promise.all(['a', 'b', 'c'].map((key) => queue.run(key, task(key, 60))))
    clearInterval(watch)
    expect(overlap('a', 'b')).toBe(true)
    expect(peak).toBe(2)
    expect(overlap('a', 'c') && overlap('b', 'c')).toBe(false)
  })

  it('keeps going after a task fails', async () => {
    const queue = new KeyedQueue({concurrency: 1})
    await expect(
      queue.run('a', async () => {
        throw new Error('boom')
      }),
    ).rejects.toThrow('boom')
    await expect(queue.run('a', async () => 'next')).resolves.toBe('next')
    expect(queue.stats()).toEqual({running: 0, pending: 0, keys: 0})
  })

  it('takes a waiting task out when its signal aborts, without breaking the order of the rest', async () => {
    const queue = new KeyedQueue({concurrency: 4})
    const {spans, task} = recorder()
    const controller = new AbortController()
    const first = queue.run('a', task('a1', 60))
    const abandoned = queue.run('a', task('a2'), {signal: controller.signal})
    const third = queue.run('a', task('a3'))
    controller.abort()
    await expect(abandoned).rejects.toMatchObject({code: 'E_RUN', retryable: true})
    await Promise.all([first, third])
    expect(spans.map((span) => span.key)).toEqual(['a1', 'a3'])
  })

  it('refuses with E_BUSY past maxPending waiting tasks', async () => {
    const queue = new KeyedQueue({concurrency: 1, maxPending: 1})
    const running = queue.run('a', () => sleep(30))
    await sleep(5)
    const waiting = queue.run('a', () => sleep(1))
    await expect(queue.run('b', () => sleep(1))).rejects.toMatchObject({code: 'E_BUSY'})
    await Promise.all([running, waiting])
  })
})

describe('withAgentLock (across processes)', () => {
  const home = () => fs.mkdtempSync(path.join(os.tmpdir(), 'meepa-lock-'))

  it('makes a second holder wait until the first is done', async () => {
    const dir = home()
    const {task, overlap} = recorder()
    await Promise.all([
      withAgentLock(dir, 'a', task('first', 150)),
      sleep(20).then(() => withAgentLock(dir, 'a', task('second', 10))),
    ])
    expect(overlap('first', 'second')).toBe(false)
    expect(fs.existsSync(path.join(dir, 'locks', 'agent-a.lock'))).toBe(false)
  })

  it('takes over a lock left by a process that no longer exists', async () => {
    const dir = home()
    fs.mkdirSync(path.join(dir, 'locks'))
    fs.writeFileSync(path.join(dir, 'locks', 'agent-a.lock'), `999999999 ${os.hostname()}\n`)
    await expect(withAgentLock(dir, 'a', async () => 'ran', {waitMs: 1000})).resolves.toBe('ran')
  })

  it('gives up with E_BUSY when a live holder keeps it past the wait', async () => {
    const dir = home()
    fs.mkdirSync(path.join(dir, 'locks'))
    fs.writeFileSync(path.join(dir, 'locks', 'agent-a.lock'), `${process.ppid} ${os.hostname()}\n`)
    await expect(withAgentLock(dir, 'a', async () => 'ran', {waitMs: 300})).rejects.toMatchObject({code: 'E_BUSY'})
  })
})
