import {execa} from 'execa'
import fs from 'node:fs'
import os from 'node:os'
import path from 'node:path'
import {afterEach, describe, expect, it} from 'vitest'
import type {FakeLlm} from '../../fakes/llm-server.js'
import {fakeLlmForTests} from '../../helpers/fake-llm-for-tests.js'
import {BIN, fakeLlmConfig, makeHome, runCli, type TestHome} from '../../helpers/home.js'
import {requireLandlockOrSkip} from '../../helpers/landlock-support.js'

/*
 * Issue 27 criterion 3: nothing of a run survives it, whatever shape it leaves in its TMPDIR. The
 * trees are what a hostile agent leaves: 500,000 entries, nested far past PATH_MAX (where every
 * call taking a full path fails with ENAMETOOLONG). They are built on a tmpfs TMPDIR so the test
 * is fast; the removal does not care where they are.
 */

let llm: FakeLlm
fakeLlmForTests((started) => (llm = started), {resetBeforeEach: true})

const homes: TestHome[] = []
const cleanups: Array<() => Promise<unknown>> = []
afterEach(async () => {
  for (const home of homes.splice(0)) home.cleanup()
  for (const cleanup of cleanups.splice(0).reverse()) await cleanup()
})

const landlock = requireLandlockOrSkip("a run's TMPDIR under the host sandbox")
const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms))

/**
 * Python that builds 500,000 entries with relative calls: 25 nested directories of 200-character
 * names (5,000 characters, past PATH_MAX) of 19,999 empty files each. Not thousands of levels: a
 * Landlock-confined process pays for every level on every call, which would make the agent slow,
 * not the removal; the helper's own tests go 3,000 levels deep.
 */
const DEEP_TREE = `import os
for i in range(25):
    os.mkdir("d" * 200); os.chdir("d" * 200)
    for j in range(19999): os.close(os.open("f%d" % j, os.O_CREAT | os.O_WRONLY, 0o644))
print("left", 25 * 20000, "entries")`

/** A tmpfs for the gateway's TMPDIR (root only), unmounted after the test. */
async function tmpfsTmpdir(): Promise<string> {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'meepa-tmpfs-tmp-'))
  await execa('mount', ['-t', 'tmpfs', '-o', 'size=512m,nr_inodes=2m', 'tmpfs', dir])
  cleanups.push(async () => {
    await execa('umount', ['-l', dir], {reject: false})
    fs.rmdirSync(dir)
  })
  return dir
}

const runDirs = (tmp: string) => fs.readdirSync(tmp).filter((name) => name.startsWith('meepa-run-'))

// Unrestricted runs and the host sandbox without its namespace layer keep TMPDIR on the host's disk
// (with the layer it is a tmpfs of the run's namespace: test/sandbox/bwrap/private-tmp.test.ts).
const ON_HOST_DISK = {file_access: {unrestricted: true}}

describe.runIf(landlock && process.getuid?.() === 0)(
  "a run's TMPDIR on the host (root: tmpfs and chattr)",
  {timeout: 300_000},
  () => {
    it('a 500,000-entry tree nested past PATH_MAX in TMPDIR is removed after the run, and the reply delivered', async () => {
      const tmp = await tmpfsTmpdir()
      const home = makeHome(fakeLlmConfig(llm.openaiBaseUrl, [{id: 'a1', limits: {disk: '4g'}, ...ON_HOST_DISK}]))
      homes.push(home)
      llm.enqueue(
        {
          toolCalls: [
            {name: 'shell', arguments: {command: `cd "$TMPDIR" && python3 -c '${DEEP_TREE}'`, timeout_seconds: 120}},
          ],
        },
        (request) => ({
          text: `tool said: ${request.body.messages.at(-1).content}`,
        }),
      )
      const result = await runCli(['send', '--agent', 'a1', 'leave a deep tree'], {
        home: home.home,
        env: {TMPDIR: tmp},
        timeoutMs: 280_000,
      })
      expect(result.stderr).not.toContain('could not remove')
      expect(result.stdout).toContain('left 500000 entries')
      expect(result.exitCode).toBe(0)
      expect(runDirs(tmp)).toEqual([])
    })

    it('the start-up reaper removes a 500,000-entry tree a dead owner left in /tmp/meepa-run-*', async () => {
      const tmp = await tmpfsTmpdir()
      // pid 4000000 is past every pid this machine hands out (pid_max is at most 4194304 and not reached here)
      const left = path.join(tmp, 'meepa-run-4000000-run_dead-x1')
      fs.mkdirSync(left)
      await execa('python3', ['-c', DEEP_TREE], {cwd: left})
      const home = makeHome(fakeLlmConfig(llm.openaiBaseUrl, [{id: 'a1'}]))
      homes.push(home)
      llm.enqueue({text: 'answered while reclaiming'})
      const result = await runCli(['send', '--agent', 'a1', 'hello'], {
        home: home.home,
        env: {TMPDIR: tmp},
        timeoutMs: 280_000,
      })
      expect(result.stdout.trim()).toBe('answered while reclaiming')
      expect(result.exitCode).toBe(0)
      expect(fs.existsSync(left)).toBe(false)
      expect(runDirs(tmp)).toEqual([])
    })

    it("a TMPDIR that cannot be removed is logged; the run's reply is still delivered", async () => {
      const home = makeHome(fakeLlmConfig(llm.openaiBaseUrl, [{id: 'a1', ...ON_HOST_DISK}]))
      homes.push(home)
      llm.enqueue(
        {
          toolCalls: [
            {
              name: 'shell',
              arguments: {
                command: 'mkdir "$TMPDIR/kept" && echo x > "$TMPDIR/kept/f" && sleep 3 && echo done',
                timeout_seconds: 30,
              },
            },
          ],
        },
        () => ({text: 'the reply'}),
      )
      const send = execa(process.execPath, [BIN, 'send', '--agent', 'a1', 'hello'], {
        env: {MEEPAGATEWAY_HOME: home.home, FAKE_LLM_KEY: 'sk-fake-test-key-123456'},
        reject: false,
      })
      // the fault: the run's file made immutable (ext4 /tmp) while the run still sleeps, so its removal fails
      const prefix = `meepa-run-${send.pid}-`
      let file: string | undefined
      for (const deadline = Date.now() + 30_000; !file && Date.now() < deadline; await sleep(50)) {
        const dir = fs.readdirSync(os.tmpdir()).find((name) => name.startsWith(prefix))
        if (dir && fs.existsSync(path.join(os.tmpdir(), dir, 'kept', 'f')))
          file = path.join(os.tmpdir(), dir, 'kept', 'f')
      }
      expect(file).toBeDefined()
      await execa('chattr', ['+i', file!])
      cleanups.push(async () => {
        await execa('chattr', ['-i', file!], {reject: false})
        fs.rmSync(path.dirname(path.dirname(file!)), {recursive: true, force: true})
      })
      const result = await send
      expect(String(result.stdout).trim()).toBe('the reply')
      expect(result.exitCode).toBe(0)
      expect(String(result.stderr)).toMatch(
        /could not remove the run's TMPDIR .*cannot remove 'f' at depth 2: Operation not permitted/,
      )
    })
  },
)

describe.runIf(landlock)("sandbox exec's TMPDIR", {timeout: 120_000}, () => {
  it("a command's tree nested past PATH_MAX in TMPDIR is removed after it, and its exit status kept", async () => {
    const tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'meepa-exec-tmp-'))
    cleanups.push(async () => fs.rmdirSync(tmp))
    // best effort without the namespace layer: TMPDIR on the host's disk
    const home = makeHome(fakeLlmConfig(llm.openaiBaseUrl, [{id: 'a1', file_access: {best_effort: true}}]))
    homes.push(home)
    const nest = `import os
os.chdir(os.environ["TMPDIR"])
for i in range(25):
    os.mkdir("d" * 200); os.chdir("d" * 200); open("f", "w").close()`
    const result = await runCli(
      ['sandbox', 'exec', '--agent', 'a1', '--', 'sh', '-c', `python3 -c '${nest}' && exit 3`],
      {home: home.home, env: {TMPDIR: tmp, MEEPA_SANDBOX_NO_NAMESPACES: '1'}},
    )
    expect(result.stderr).toMatch(/^(sandbox: best effort, NOT enforced: [^\n]*\n?)+$/)
    expect(result.exitCode).toBe(3)
    expect(fs.readdirSync(tmp)).toEqual([])
  })
})
