import {execa} from 'execa'
import fs from 'node:fs'
import os from 'node:os'
import path from 'node:path'
import {afterEach, describe, expect, it} from 'vitest'
import type {FakeLlm} from '../../fakes/llm-server.js'
import {fakeLlmForTests} from '../../helpers/fake-llm-for-tests.js'
import {BIN, fakeLlmConfig, makeHome, runCli, type TestHome} from '../../helpers/home.js'
import {processesWith, uniqueMarker} from '../../helpers/processes.js'
import {requireLandlockOrSkip} from '../../helpers/landlock-support.js'
import {cgroupSupport} from '../../../src/sandbox/run-cgroup.js'
import {removeTrees} from '../../../src/sandbox/directory-tree.js'

/*
 * Issue 12 criterion 3 and issue 14 criterion 5: limits at every level, on by default. Each limit
 * is attacked for real under the host sandbox, through the built CLI: a memory hog, a fork bomb,
 * an agent filling the disk (a small tmpfs as MEEPAGATEWAY_HOME).
 */

let llm: FakeLlm
fakeLlmForTests((started) => (llm = started), {resetBeforeEach: true})

const homes: TestHome[] = []
const mounts: string[] = []
afterEach(async () => {
  for (const home of homes.splice(0)) home.cleanup()
  for (const dir of mounts.splice(0)) {
    await execa('umount', ['-l', dir], {reject: false})
    fs.rmSync(dir, {recursive: true, force: true})
  }
})

const landlock = requireLandlockOrSkip('resource limits under the host sandbox')
const cgroups = cgroupSupport()

/** Scripts one shell tool call and a final answer that quotes the tool's result. */
function scriptShell(command: string, timeoutSeconds: number): void {
  llm.enqueue({toolCalls: [{name: 'shell', arguments: {command, timeout_seconds: timeoutSeconds}}]}, (request) => ({
    text: `tool said: ${request.body.messages.at(-1).content}`,
  }))
}

/** The host still answers at once: a process starts and exits well within a second. */
async function hostResponsive(): Promise<void> {
  const started = Date.now()
  await execa('sh', ['-c', 'true'])
  expect(Date.now() - started).toBeLessThan(1000)
}

describe.runIf(landlock && cgroups.mode !== 'none')(
  'limits under the host sandbox (cgroup per run)',
  {timeout: 120_000},
  () => {
    it('a memory hog ends the run with E_OOM naming limits.memory; nothing of it is left', async () => {
      const home = makeHome(fakeLlmConfig(llm.openaiBaseUrl, [{id: 'a1', limits: {memory: '256m'}}]))
      homes.push(home)
      const tag = uniqueMarker()
      scriptShell(`head -c 2000m /dev/zero | tail # ${tag}`, 60)
      const started = Date.now()
      const result = await runCli(['send', '--agent', 'a1', 'eat memory', '--json'], {home: home.home})
      expect(result.exitCode).toBe(7)
      expect(JSON.parse(result.stdout).error).toMatchObject({
        code: 'E_OOM',
        message: expect.stringContaining('limits.memory (256m)'),
      })
      expect(Date.now() - started).toBeLessThan(30_000)
      expect(processesWith(tag)).toEqual([])
      await hostResponsive()
    })

    it('a fork bomb is held at limits.pids, ends the run with E_LIMIT, and every process is gone', async () => {
      const home = makeHome(fakeLlmConfig(llm.openaiBaseUrl, [{id: 'a1', limits: {pids: 64}}]))
      homes.push(home)
      const tag = uniqueMarker()
      scriptShell(`bash -c ':(){ :|:& };: # ${tag}'; sleep 4`, 8)
      const started = Date.now()
      const result = await runCli(['send', '--agent', 'a1', 'fork', '--json'], {home: home.home})
      expect(JSON.parse(result.stdout).error).toMatchObject({
        code: 'E_LIMIT',
        message: expect.stringContaining('limits.pids (64'),
      })
      expect(result.exitCode).toBe(7)
      expect(Date.now() - started).toBeLessThan(40_000)
      expect(processesWith(tag)).toEqual([])
      await hostResponsive()
    })

    it.runIf(cgroups.enforced.cpu)('a busy loop gets no more CPU time than limits.cpus', async () => {
      const home = makeHome(fakeLlmConfig(llm.openaiBaseUrl, [{id: 'a1', limits: {cpus: 0.2}}]))
      homes.push(home)
      // `times` prints the CPU time of the shell's finished children: user then system, per line
      scriptShell("timeout 2 sh -c 'while :; do :; done'; times", 30)
      const result = await runCli(['send', '--agent', 'a1', 'spin'], {home: home.home})
      const children = /\n(\d+)m([\d.]+)s (\d+)m([\d.]+)s\s*$/.exec(result.stdout.trim())
      expect(children, result.stdout).not.toBeNull()
      const [, userMin, userSec, sysMin, sysSec] = children!.map(Number) as number[]
      const cpuSeconds = (userMin as number) * 60 + (userSec as number) + (sysMin as number) * 60 + (sysSec as number)
      expect(cpuSeconds).toBeGreaterThan(0.1) // it did spin
      expect(cpuSeconds).toBeLessThan(0.7) // 0.2 CPU over 2 s is 0.4 s; unlimited it would be up to 2 s
    })

    it('sandbox explain says which limits are enforced and how', async () => {
      const home = makeHome(
        fakeLlmConfig(llm.openaiBaseUrl, [{id: 'a1', limits: {memory: '300m', pids: 100, cpus: 0.5, disk: '2g'}}]),
      )
      homes.push(home)
      const result = await runCli(['sandbox', 'explain', '--agent', 'a1', '--json'], {home: home.home})
      const {limits} = JSON.parse(result.stdout)
      expect(limits).toEqual(
        expect.arrayContaining([
          expect.objectContaining({
            limit: 'memory',
            value: '300m',
            enforced: true,
            how: expect.stringContaining(`cgroup ${cgroups.mode}`),
          }),
          expect.objectContaining({limit: 'pids', value: '100', enforced: true}),
          expect.objectContaining({limit: 'cpus', value: '0.5', enforced: cgroups.enforced.cpu}),
          expect.objectContaining({
            limit: 'disk',
            value: '2g',
            enforced: true,
            how: expect.stringContaining('RLIMIT_FSIZE'),
          }),
          expect.objectContaining({limit: 'owner', enforced: true}),
        ]),
      )
      const text = await runCli(['sandbox', 'explain', '--agent', 'a1'], {home: home.home})
      expect(text.stdout).toMatch(/resource limits \(limits section\):\n {2}memory 300m: enforced/)
    })

    it('the cgroup limits hold for the unrestricted level too', async () => {
      const home = makeHome(
        fakeLlmConfig(llm.openaiBaseUrl, [{id: 'a1', limits: {memory: '256m'}, file_access: {unrestricted: true}}]),
      )
      homes.push(home)
      scriptShell(`head -c 2000m /dev/zero | tail # ${uniqueMarker()}`, 60)
      const result = await runCli(['send', '--agent', 'a1', 'eat memory', '--json'], {home: home.home})
      expect(JSON.parse(result.stdout).error).toMatchObject({code: 'E_OOM'})
    })
  },
)

/** A MEEPAGATEWAY_HOME on a tmpfs of `size` (root only). */
async function homeOnTmpfs(size: string, config: unknown): Promise<TestHome> {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'meepa-tmpfs-home-'))
  await execa('mount', ['-t', 'tmpfs', '-o', `size=${size}`, 'tmpfs', dir])
  mounts.push(dir)
  const home = makeHome(config)
  fs.cpSync(home.configPath, path.join(dir, 'config.yaml'))
  home.cleanup()
  return {
    ...home,
    home: dir,
    configPath: path.join(dir, 'config.yaml'),
    workspace: (id) => path.join(dir, 'agents', id),
    cleanup: () => {},
  }
}

describe.runIf(landlock && process.getuid?.() === 0)(
  'limits.disk (a small tmpfs as the gateway home)',
  {timeout: 120_000},
  () => {
    it('an agent filling its workspace is stopped at limits.disk with E_DISK; the other agent keeps answering', async () => {
      const home = await homeOnTmpfs(
        '64m',
        fakeLlmConfig(llm.openaiBaseUrl, [{id: 'filler', limits: {disk: '8m'}}, {id: 'other'}]),
      )
      scriptShell('head -c 40m /dev/zero > big; echo "exit $?"', 30)
      const filled = await runCli(['send', '--agent', 'filler', 'fill the disk', '--json'], {home: home.home})
      expect(JSON.parse(filled.stdout).error).toMatchObject({
        code: 'E_DISK',
        message: expect.stringContaining('limits.disk (8m)'),
      })
      expect(filled.exitCode).toBe(7)
      // the kernel stopped the file at the limit (RLIMIT_FSIZE), so the disk did not fill
      expect(fs.statSync(path.join(home.workspace('filler'), 'big')).size).toBeLessThanOrEqual(8 * 1024 * 1024)
      llm.enqueue({text: 'still here'})
      const other = await runCli(['send', '--agent', 'other', 'hello'], {home: home.home})
      expect(other.stderr).toBe('')
      expect(other.stdout.trim()).toBe('still here')
      // the agent over its limit is refused, with the fix, until files are removed; the refused run
      // never reached its LLM
      const requestsBefore = llm.requests.length
      const refused = await runCli(['send', '--agent', 'filler', 'again', '--json'], {home: home.home})
      expect(JSON.parse(refused.stdout).error).toMatchObject({
        code: 'E_DISK',
        message: expect.stringContaining('already uses'),
        suggestions: expect.arrayContaining([expect.stringContaining('remove files from')]),
      })
      expect(llm.requests.length).toBe(requestsBefore)
      fs.rmSync(path.join(home.workspace('filler'), 'big'))
      llm.enqueue({text: 'room again'})
      expect((await runCli(['send', '--agent', 'filler', 'again'], {home: home.home})).stdout.trim()).toBe('room again')
    })

    // KNOWN GAP (red team): limits.disk caps each file (RLIMIT_FSIZE) and measures the total about once
    // a second, so many files just under the cap, written between two measurements, stay on disk far
    // past the limit (here the whole 64m home). E_DISK is reported, but the space stays used after the
    // run until the operator removes files. Needs a real quota (project quota or a size-limited mount
    // per workspace); the measurement cannot close it.
    it.fails('many files each under the per-file cap do not take the workspace far past limits.disk', async () => {
      const home = await homeOnTmpfs(
        '64m',
        fakeLlmConfig(llm.openaiBaseUrl, [{id: 'filler', limits: {disk: '8m'}}, {id: 'other'}]),
      )
      scriptShell('for i in 1 2 3 4 5 6 7 8 9; do head -c 7m /dev/zero > f$i; done; echo "exit $?"', 30)
      const filled = await runCli(['send', '--agent', 'filler', 'fill the disk', '--json'], {home: home.home})
      expect(JSON.parse(filled.stdout).error).toMatchObject({code: 'E_DISK'})
      const kept = fs
        .readdirSync(home.workspace('filler'))
        .filter((name) => /^f\d$/.test(name))
        .reduce((sum, name) => sum + fs.statSync(path.join(home.workspace('filler'), name)).size, 0)
      expect(kept).toBeLessThanOrEqual(2 * 8 * 1024 * 1024)
    })

    // Issue 27 (red team): the measurement walked full paths and skipped what readdir refused
    // (ENAMETOOLONG past PATH_MAX), so files below a deep path were never counted.
    it('files below a path longer than PATH_MAX count: E_DISK, and the next run is refused', async () => {
      const home = makeHome(fakeLlmConfig(llm.openaiBaseUrl, [{id: 'filler', limits: {disk: '8m'}}]))
      homes.push(home)
      const hide = `import os
for i in range(25):
    os.mkdir("x" * 200); os.chdir("x" * 200)
for i in range(10):
    open("big%d" % i, "wb").write(bytes(7 << 20))
print("hidden")`
      scriptShell(`python3 -c '${hide}'; echo "exit $?"`, 30)
      try {
        const filled = await runCli(['send', '--agent', 'filler', 'hide files deep', '--json'], {home: home.home})
        expect(JSON.parse(filled.stdout).error, filled.stdout).toMatchObject({
          code: 'E_DISK',
          message: expect.stringContaining('limits.disk (8m)'),
        })
        const requestsBefore = llm.requests.length
        const refused = await runCli(['send', '--agent', 'filler', 'again', '--json'], {home: home.home})
        expect(JSON.parse(refused.stdout).error).toMatchObject({
          code: 'E_DISK',
          message: expect.stringContaining('already uses'),
        })
        expect(llm.requests.length).toBe(requestsBefore)
      } finally {
        // too deep for the home's own clean-up (full paths)
        await removeTrees([home.workspace('filler')])
      }
    })

    it('one fallocate(FALLOC_FL_KEEP_SIZE) cannot reserve disk past limits.disk (it grows no file size, so RLIMIT_FSIZE never sees it)', async () => {
      // on the real disk (ext4 here): tmpfs checks RLIMIT_FSIZE in fallocate even with KEEP_SIZE, ext4 does not
      const home = makeHome(fakeLlmConfig(llm.openaiBaseUrl, [{id: 'filler', limits: {disk: '8m'}}]))
      homes.push(home)
      const reserve = `import ctypes, os; libc = ctypes.CDLL(None, use_errno=True); fd = os.open("reserved", os.O_CREAT | os.O_WRONLY); r = libc.fallocate(fd, 1, ctypes.c_long(0), ctypes.c_long(56 << 20)); print("fallocate", r, os.strerror(ctypes.get_errno()) if r else "ok")`
      scriptShell(`python3 -c '${reserve}'; echo "exit $?"`, 30)
      const result = await runCli(['send', '--agent', 'filler', 'reserve the disk', '--json'], {home: home.home})
      const blocks = fs.statSync(path.join(home.workspace('filler'), 'reserved')).blocks * 512
      expect(blocks, result.stdout).toBeLessThanOrEqual(8 * 1024 * 1024)
    })

    // Red team: space held by files the run unlinked while keeping them open (or O_TMPFILE) is on no
    // path; the measurement counts it through the open files of the run's cgroup members.
    it('space held in unlinked open files past limits.disk ends the run with E_DISK', async () => {
      const home = makeHome(fakeLlmConfig(llm.openaiBaseUrl, [{id: 'filler', limits: {disk: '8m'}}]))
      homes.push(home)
      const hide = `import os, time
held = []
for i in range(10):
    f = open("hidden%d" % i, "wb"); f.write(bytes(7 << 20)); f.flush(); os.unlink("hidden%d" % i); held.append(f)
time.sleep(4); print("held", len(held))`
      scriptShell(`python3 -c '${hide}'; echo "exit $?"`, 30)
      const result = await runCli(['send', '--agent', 'filler', 'hide files', '--json'], {home: home.home})
      expect(JSON.parse(result.stdout).error, result.stdout).toMatchObject({code: 'E_DISK'})
    })

    it('empty files are not free: each costs at least a block, so inodes cannot be exhausted under limits.disk', async () => {
      const home = makeHome(fakeLlmConfig(llm.openaiBaseUrl, [{id: 'filler', limits: {disk: '8m'}}]))
      homes.push(home)
      scriptShell(
        `python3 -c 'import os
os.mkdir("many")
for i in range(20000): open("many/%d" % i, "w").close()
print("created")'; echo "exit $?"`,
        30,
      )
      const result = await runCli(['send', '--agent', 'filler', 'many empty files', '--json'], {home: home.home})
      expect(JSON.parse(result.stdout).error, result.stdout).toMatchObject({code: 'E_DISK'})
    })

    it('a reply already computed is delivered when the disk is full and its history cannot be written', async () => {
      const home = await homeOnTmpfs('48m', fakeLlmConfig(llm.openaiBaseUrl, [{id: 'a1'}]))
      llm.enqueue({text: 'first'})
      expect((await runCli(['send', '--agent', 'a1', 'first'], {home: home.home})).exitCode).toBe(0)
      // fills the whole filesystem (limits.disk, 1g by default, is larger than it)
      scriptShell('head -c 100m /dev/zero > big; cat /dev/zero > big2; df -k .', 30)
      const result = await runCli(['send', '--agent', 'a1', 'fill everything'], {home: home.home})
      expect(result.exitCode).toBe(0)
      expect(result.stdout).toContain('tool said:')
      expect(result.stdout).toMatch(/No space left on device/)
      expect(result.stderr).toContain('could not save this conversation to memory.db (the reply is delivered anyway)')
    })
  },
)

describe.runIf(process.getuid?.() === 0 && fs.existsSync('/usr/bin/setpriv'))(
  'limits where the gateway cannot create cgroups (not root)',
  {timeout: 60_000},
  () => {
    /** The built CLI as the unprivileged user nobody, on a home nobody owns. */
    const asNobody = async (home: TestHome, args: string[]) => {
      await execa('chown', ['-R', '65534:65534', home.home])
      const result = await execa(
        'setpriv',
        [
          '--reuid=65534',
          '--regid=65534',
          '--clear-groups',
          'env',
          `MEEPAGATEWAY_HOME=${home.home}`,
          `HOME=${home.home}`,
          'FAKE_LLM_KEY=sk-fake-test-key-123456',
          process.execPath,
          BIN,
          ...args,
        ],
        {reject: false, timeout: 60_000},
      )
      return {stdout: String(result.stdout), stderr: String(result.stderr), exitCode: result.exitCode}
    }

    it('sandbox explain and the run itself say honestly that memory, pids and CPU are not enforced', async () => {
      const home = makeHome(fakeLlmConfig(llm.openaiBaseUrl, [{id: 'a1', file_access: {unrestricted: true}}]))
      fs.chmodSync(home.home, 0o755)
      homes.push(home)
      const explain = await asNobody(home, ['sandbox', 'explain', '--agent', 'a1', '--json'])
      const limits = JSON.parse(explain.stdout).limits as Array<{limit: string; enforced: boolean; how: string}>
      for (const name of ['memory', 'pids', 'cpus']) {
        expect(limits.find((limit) => limit.limit === name)).toMatchObject({
          enforced: false,
          how: expect.stringContaining('NOT enforced'),
        })
      }
      llm.enqueue({text: 'answered without cgroups'})
      const sent = await asNobody(home, ['send', '--agent', 'a1', 'hi'])
      expect(sent.stdout.trim()).toBe('answered without cgroups')
      expect(sent.stderr).toContain('limits.memory, limits.pids and limits.cpus are NOT enforced on this host')
    })
  },
)
