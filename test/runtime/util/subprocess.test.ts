import {spawn} from 'node:child_process'
import path from 'node:path'
import {describe, expect, it} from 'vitest'
import {ROOT} from '../../helpers/home.js'
import {startSubprocess} from '../../../src/runtime/util/subprocess.js'
import {processAlive} from '../../../src/runtime/util/process-alive.js'

// The runtime's one way (execa, wrapped) to start a short-lived child (the docker CLI, the sandbox helper's probe,
// `sandbox exec`, the agent's shell tool): each fault is caused for real and must end in a result,
// never a hang, a rejection or an uncaught error.
const PATH = process.env.PATH ?? '/usr/bin:/bin'

describe('startSubprocess', () => {
  it('gives the exit status, buffered output without its final newline, and the input it was fed', async () => {
    const result = await startSubprocess('sh', ['-c', 'cat; echo err >&2; exit 3'], {
      env: {PATH},
      stdio: ['pipe', 'pipe', 'pipe'],
      input: 'hello\n',
    })
    expect(result).toMatchObject({
      exitCode: 3,
      stdout: 'hello',
      stderr: 'err',
      failed: true,
      timedOut: false,
      isCanceled: false,
      message: 'exit 3',
    })
  })

  it('keeps stdout and stderr interleaved in arrival order with `all`', async () => {
    const result = await startSubprocess('sh', ['-c', 'echo one; sleep 0.05; echo two >&2; sleep 0.05; echo three'], {
      env: {PATH},
      all: true,
    })
    expect(result.all).toBe('one\ntwo\nthree')
    expect(result.exitCode).toBe(0)
    expect(result.failed).toBe(false)
  })

  it('reports a missing executable as ENOENT instead of throwing', async () => {
    const result = await startSubprocess('/nonexistent/docker', ['version'], {env: {PATH}})
    expect(result).toMatchObject({code: 'ENOENT', exitCode: undefined, failed: true})
    expect(result.message).toMatch(/ENOENT/)
  })

  // Node 20's ChildProcess.kill() on a spawn that failed calls kill(0, signal): the caller's whole
  // process group. Run where that group is the script's own (detached), next to a canary in it.
  it('never signals its own process group when the child never started (cancel or deadline of a missing executable)', async () => {
    const script = `
      import {startSubprocess} from ${JSON.stringify(path.join(ROOT, 'dist', 'runtime', 'util', 'subprocess.js'))}
      let received = 0
      process.on('SIGTERM', () => received++)
      const cancelled = await startSubprocess('/nonexistent/docker', ['ps'], {env: {}, signal: AbortSignal.abort()})
      const controller = new AbortController()
      const racing = startSubprocess('/nonexistent/docker', ['ps'], {env: {}, signal: controller.signal, timeoutMs: 0})
      controller.abort()
      const timed = await racing
      await new Promise((resolve) => setTimeout(resolve, 200))
      console.log(JSON.stringify({received, codes: [cancelled.code, timed.code]}))
    `
    const child = spawn(process.execPath, ['--input-type=module', '-e', script], {
      detached: true,
      stdio: ['ignore', 'pipe', 'inherit'],
    })
    let stdout = ''
    child.stdout.on('data', (chunk: Buffer) => (stdout += chunk.toString()))
    const code = await new Promise((resolve) => child.on('close', resolve))
    expect(code).toBe(0)
    expect(JSON.parse(stdout)).toEqual({received: 0, codes: ['ENOENT', 'ENOENT']})
  })

  it('kills at the deadline, even when a process it started holds the pipes open', async () => {
    const started = Date.now()
    // the background sleep keeps stdout open after its parent is killed
    const child = startSubprocess('sh', ['-c', 'sleep 30 & echo $!; sleep 30'], {
      env: {PATH},
      timeoutMs: 300,
      detached: true,
    })
    const result = await child
    expect(result).toMatchObject({timedOut: true, signal: 'SIGTERM', exitCode: undefined, failed: true})
    expect(Date.now() - started).toBeLessThan(5_000)
    const orphan = Number(result.stdout.split('\n')[0])
    expect(orphan).toBeGreaterThan(1)
    process.kill(-child.pid!, 'SIGKILL')
  })

  it('SIGKILLs a child that ignores the first signal after forceKillAfterMs', async () => {
    const result = await startSubprocess('sh', ['-c', "trap '' TERM; echo ready; sleep 30"], {
      env: {PATH},
      timeoutMs: 300,
      forceKillAfterMs: 300,
    })
    expect(result).toMatchObject({timedOut: true, signal: 'SIGKILL'})
  })

  it('stops on its AbortSignal (isCanceled), including one aborted before the start', async () => {
    const controller = new AbortController()
    const child = startSubprocess('sleep', ['30'], {env: {PATH}, signal: controller.signal})
    setTimeout(() => controller.abort(), 100)
    expect(await child).toMatchObject({isCanceled: true, signal: 'SIGTERM', failed: true})
    expect(processAlive(child.pid!)).toBe(false)
    expect(await startSubprocess('sleep', ['30'], {env: {PATH}, signal: AbortSignal.abort()})).toMatchObject({
      isCanceled: true,
    })
  })

  it('kills a child whose output passes maxBuffer and keeps what came before', async () => {
    const result = await startSubprocess('sh', ['-c', 'yes x'], {env: {PATH}, maxBuffer: 64 * 1024})
    expect(result.failed).toBe(true)
    expect(result.message).toBe('stdout exceeded 65536 characters')
    expect(result.stdout.length).toBeLessThanOrEqual(64 * 1024)
    expect(result.stdout.startsWith('x\nx\n')).toBe(true)
  })

  // the child is gone, but what it started holds the pipes: the limits still hold (found by an outside review)
  describe('after the child itself exited', () => {
    it('a flood past maxBuffer from what it left running ends the call as an overflow', async () => {
      const child = startSubprocess('sh', ['-c', 'yes x & exit 0'], {env: {PATH}, maxBuffer: 64 * 1024, detached: true})
      expect(await child).toMatchObject({failed: true, message: 'stdout exceeded 65536 characters'})
    })

    it('output cut at maxBuffer is reported as failed, never as a clean exit', async () => {
      const child = startSubprocess('sh', ['-c', '(sleep 0.2; head -c 300000 /dev/zero | tr "\\000" z) & exit 0'], {
        env: {PATH},
        maxBuffer: 64 * 1024,
        detached: true,
      })
      const result = await child
      expect(result.stdout.length).toBeLessThanOrEqual(64 * 1024)
      expect(result).toMatchObject({exitCode: 0, failed: true})
    })

    it('the deadline holds: timedOut, not a clean exit 0 when the background process ends', async () => {
      const started = Date.now()
      const child = startSubprocess('sh', ['-c', 'sleep 30 & exit 0'], {env: {PATH}, timeoutMs: 300, detached: true})
      expect(await child).toMatchObject({timedOut: true, failed: true})
      expect(Date.now() - started).toBeLessThan(5_000)
      process.kill(-child.pid!, 'SIGKILL')
    })
  })

  it('leaves an unbuffered stream to the caller and survives a child that exits without reading its stdin', async () => {
    const child = startSubprocess('sh', ['-c', 'echo streamed; exit 0'], {
      env: {PATH},
      stdio: ['pipe', 'pipe', 'pipe'],
      buffer: {stdout: false},
    })
    const chunks: Buffer[] = []
    child.stdout!.on('data', (chunk: Buffer) => chunks.push(chunk))
    // written after the child is gone: EPIPE must not escape as an uncaught error
    setTimeout(() => child.stdin!.write('x'.repeat(1 << 20)), 100)
    const result = await child
    await new Promise((resolve) => setTimeout(resolve, 200))
    expect(Buffer.concat(chunks).toString()).toBe('streamed\n')
    expect(result).toMatchObject({exitCode: 0, stdout: ''})
  })

  // a CPU running only SCHED_IDLE work counts as idle when a waking task is placed: other work takes it at once
  it('with `idle`, runs the child itself (its pid, its argv) at SCHED_IDLE and the idle I/O class', async () => {
    const result = await startSubprocess(
      'sh',
      ['-c', 'chrt -p $$; ionice -p $$; tr "\\0" " " < /proc/$$/cmdline', 'walk'],
      {env: {PATH}, idle: true},
    )
    expect(result.stdout).toMatch(/current scheduling policy: SCHED_IDLE$/m)
    expect(result.stdout).toMatch(/^idle$/m)
    expect(result.stdout).toMatch(/^sh -c .* walk $/m)

    const started = performance.now()
    const stopped = await startSubprocess('sleep', ['30'], {env: {PATH}, idle: true, timeoutMs: 200})
    expect(stopped).toMatchObject({timedOut: true, signal: 'SIGTERM'})
    expect(performance.now() - started).toBeLessThan(5000)
  })

  it('with `idle` where chrt and ionice are not on its PATH, runs the child as it is', async () => {
    const result = await startSubprocess('/bin/sh', ['-c', '/usr/bin/chrt -p $$'], {
      env: {PATH: '/nonexistent'},
      idle: true,
    })
    expect(result.exitCode).toBe(0)
    expect(result.stdout).toMatch(/current scheduling policy: SCHED_OTHER$/m)
  })

  it('gives the child only the environment it is given', async () => {
    process.env.MEEPA_SUBPROCESS_TEST_SECRET = 'sk-should-not-pass'
    try {
      const result = await startSubprocess('/usr/bin/env', [], {env: {ONLY: 'this'}})
      expect(result.stdout).toBe('ONLY=this')
    } finally {
      delete process.env.MEEPA_SUBPROCESS_TEST_SECRET
    }
  })
})
