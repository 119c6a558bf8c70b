import {execa} from 'execa'
import fs from 'node:fs'
import os from 'node:os'
import path from 'node:path'
import type {Duplex} from 'node:stream'
import {describe, expect, it} from 'vitest'
import {setKeeperDeadline} from '../../src/sandbox/keeper.js'
import {HELPER} from '../helpers/landlock-support.js'

/*
 * The keeper (meepa-sandbox --keeper-fd) on its own, without cgroups: transparent to the run's
 * stdin/stdout and exit status, relays signals, and when its owner dies kills every descendant,
 * even one that left the run's session (setsid is allowed at the unrestricted level).
 */

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms))
const alive = (pid: number) => {
  try {
    const stat = fs.readFileSync(`/proc/${pid}/stat`, 'utf8')
    return !stat.slice(stat.lastIndexOf(')') + 2).startsWith('Z')
  } catch {
    return false
  }
}

function readCmdline(pid: string): string {
  try {
    return fs.readFileSync(`/proc/${pid}/cmdline`, 'utf8')
  } catch {
    return ''
  }
}

/** Runs the keeper with a lifeline on fd 3 held by this process (as the runners do). */
function keeper(argv: string[], input?: string) {
  return execa(HELPER, ['--keeper-fd', '3', '--', ...argv], {
    stdio: ['pipe', 'pipe', 'pipe', 'pipe'],
    input,
    reject: false,
    detached: true,
  })
}

describe.runIf(process.platform === 'linux' && fs.existsSync(HELPER))('the keeper', {timeout: 30_000}, () => {
  it('passes stdin, stdout and the exit status through untouched', async () => {
    const result = await keeper(['sh', '-c', 'cat; echo " and more"; exit 7'], '{"line":1}\n{"line":2}\n')
    expect(result.stdout).toBe('{"line":1}\n{"line":2}\n and more')
    expect(result.exitCode).toBe(7)
  })

  it('relays SIGTERM to the run and exits with its status (143)', async () => {
    const child = keeper(['sh', '-c', 'echo ready; exec sleep 20'])
    await new Promise<void>((resolve) => child.stdout?.once('data', () => resolve()))
    child.kill('SIGTERM')
    expect((await child).exitCode).toBe(143)
  })

  it('kills what the run left in the background when it exits, even in a session of its own', async () => {
    const pidFile = path.join(fs.mkdtempSync(path.join(os.tmpdir(), 'keeper-')), 'pid')
    const result = await keeper(['sh', '-c', `setsid sh -c 'echo $$ > ${pidFile}; exec sleep 30' & sleep 0.3`])
    expect(result.exitCode).toBe(0)
    const pid = Number(fs.readFileSync(pidFile, 'utf8'))
    await sleep(100)
    expect(alive(pid)).toBe(false)
  })

  it('kills the whole run, double-forked and setsid descendants included, when its owner dies', async () => {
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'keeper-'))
    // the owner: a shell holding the lifeline, killed with SIGKILL mid-run
    const owner = execa(
      'sh',
      [
        '-c',
        `exec ${HELPER} --keeper-fd 3 -- sh -c "(setsid sh -c 'echo \\$\\$ > ${dir}/pid; sleep 1; touch ${dir}/late' &) ; sleep 30" 3<&0`,
      ],
      {
        stdin: 'pipe',
        reject: false,
      },
    )
    const deadline = Date.now() + 5000
    while (!fs.existsSync(path.join(dir, 'pid')) && Date.now() < deadline) await sleep(20)
    const pid = Number(fs.readFileSync(path.join(dir, 'pid'), 'utf8'))
    // the owner here is the process holding the other end of fd 3: this test, through the pipe
    owner.stdin?.destroy()
    await sleep(300)
    expect(alive(pid)).toBe(false)
    await sleep(1200)
    expect(fs.existsSync(path.join(dir, 'late'))).toBe(false)
    owner.kill('SIGKILL')
    await owner
  })

  it.runIf(fs.existsSync('/usr/bin/bwrap'))(
    'stays the outermost owner with bubblewrap in front of the run (pid namespace, new session)',
    async () => {
      const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'keeper-'))
      const run = `(setsid sh -c 'echo $$ > ${dir}/pid; sleep 1; touch ${dir}/late' &) ; sleep 30`
      const child = keeper([
        'bwrap',
        '--unshare-pid',
        '--die-with-parent',
        '--new-session',
        '--bind',
        '/',
        '/',
        '--proc',
        '/proc',
        '--dev',
        '/dev',
        '--',
        'sh',
        '-c',
        run,
      ])
      const deadline = Date.now() + 5000
      while (!fs.existsSync(path.join(dir, 'pid')) && Date.now() < deadline) await sleep(20)
      const inside = fs
        .readdirSync('/proc')
        .filter((pid) => /^\d+$/.test(pid) && alive(Number(pid)) && readCmdline(pid).includes(dir))
      expect(inside.length).toBeGreaterThan(0)
      // the owner's end of the lifeline goes away
      ;(child.stdio[3] as NodeJS.ReadableStream & {destroy(): void}).destroy()
      await child
      await sleep(100)
      expect(inside.filter((pid) => alive(Number(pid)))).toEqual([])
      await sleep(1200)
      expect(fs.existsSync(path.join(dir, 'late'))).toBe(false)
    },
  )

  it("--remove-dir removes the run's directory, never what a planted or swapped symlink in it points at", async () => {
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'keeper-'))
    const tmp = path.join(dir, 'run-tmp')
    const victim = path.join(dir, 'victim')
    fs.mkdirSync(path.join(tmp, 'sub'), {recursive: true})
    fs.mkdirSync(victim)
    fs.writeFileSync(path.join(victim, 'keep'), 'operator data')
    fs.writeFileSync(path.join(tmp, 'sub', 'f'), 'x')
    // the run plants a link to the victim and keeps swapping a subdirectory for one, in the background, until killed
    const swap = `ln -s ${victim} ${tmp}/link; (while :; do mv ${tmp}/sub ${tmp}/sub2 2>/dev/null; ln -sfn ${victim} ${tmp}/sub; rm -f ${tmp}/sub; mv ${tmp}/sub2 ${tmp}/sub 2>/dev/null; done &) ; touch ${dir}/started; sleep 30`
    const child = execa(HELPER, ['--keeper-fd', '3', '--remove-dir', tmp, '--', 'sh', '-c', swap], {
      stdio: ['pipe', 'pipe', 'pipe', 'pipe'],
      reject: false,
      detached: true,
    })
    const deadline = Date.now() + 5000
    while (!fs.existsSync(path.join(dir, 'started')) && Date.now() < deadline) await sleep(20)
    await sleep(200)
    ;(child.stdio[3] as NodeJS.ReadableStream & {destroy(): void}).destroy()
    await child
    expect(fs.readFileSync(path.join(victim, 'keep'), 'utf8')).toBe('operator data')
    expect(fs.existsSync(tmp)).toBe(false)
    fs.rmSync(dir, {recursive: true, force: true})
  })

  it('--remove-dir removes a directory the run nested 1000 levels deep (past PATH_MAX) when the owner dies', async () => {
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'keeper-'))
    const tmp = path.join(dir, 'run-tmp')
    fs.mkdirSync(tmp)
    const nest = `import os
os.chdir(${JSON.stringify(tmp)})
for i in range(1000):
    os.mkdir("level"); os.chdir("level"); open("f", "w").close()
open(${JSON.stringify(path.join(dir, 'started'))}, "w").close()`
    const child = execa(
      HELPER,
      ['--keeper-fd', '3', '--remove-dir', tmp, '--', 'sh', '-c', `python3 -c '${nest}'; sleep 30`],
      {stdio: ['pipe', 'pipe', 'pipe', 'pipe'], reject: false, detached: true},
    )
    const deadline = Date.now() + 20_000
    while (!fs.existsSync(path.join(dir, 'started')) && Date.now() < deadline) await sleep(20)
    ;(child.stdio[3] as NodeJS.ReadableStream & {destroy(): void}).destroy()
    await child
    expect(fs.existsSync(tmp)).toBe(false)
    fs.rmSync(dir, {recursive: true, force: true})
  })

  it('ends the run at the deadline its owner wrote, on its own monotonic clock: kills it, runs --on-orphan, says T', async () => {
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'keeper-'))
    const child = execa(
      HELPER,
      [
        '--keeper-fd',
        '3',
        '--on-orphan',
        'touch',
        '--on-orphan',
        `${dir}/orphan-command-ran`,
        '--',
        'sh',
        '-c',
        `sleep 2; touch ${dir}/late`,
      ],
      {
        stdio: ['pipe', 'pipe', 'pipe', 'pipe'],
        reject: false,
        detached: true,
      },
    )
    const lifeline = child.stdio[3] as Duplex
    const said: string[] = []
    lifeline.on('data', (chunk: Buffer) => said.push(chunk.toString()))
    const started = Date.now()
    // `D600\n` in two pieces, as a stream may deliver it
    lifeline.write('D6')
    await sleep(50)
    lifeline.write('00\n')
    const ended = await child
    const ms = Date.now() - started
    expect(ms).toBeGreaterThanOrEqual(550)
    expect(ms).toBeLessThan(1500)
    expect(ended.exitCode).toBe(137)
    expect(said.join('')).toBe('T')
    expect(fs.existsSync(path.join(dir, 'orphan-command-ran'))).toBe(true)
    await sleep(2000)
    expect(fs.existsSync(path.join(dir, 'late'))).toBe(false)
    fs.rmSync(dir, {recursive: true, force: true})
  })

  it('a run that ends before its deadline is not touched by it; nonsense on the lifeline is ignored', async () => {
    const child = execa(HELPER, ['--keeper-fd', '3', '--', 'sh', '-c', 'sleep 0.5; exit 3'], {
      stdio: ['pipe', 'pipe', 'pipe', 'pipe'],
      reject: false,
      detached: true,
    })
    const lifeline = child.stdio[3] as Duplex
    lifeline.write('Dsoon\nX12\nD-5\n')
    setKeeperDeadline(lifeline, 5000)
    expect((await child).exitCode).toBe(3)
  })

  it('refuses keeper flags without --keeper-fd and a lifeline that is not open', async () => {
    expect((await execa(HELPER, ['--cgroup', '/sys/fs/cgroup/x', '--', 'true'], {reject: false})).exitCode).toBe(2)
    const closed = await execa(HELPER, ['--keeper-fd', '9', '--', 'true'], {reject: false})
    expect(closed.exitCode).toBe(125)
    expect(closed.stderr).toContain('--keeper-fd 9 is not open')
  })
})
