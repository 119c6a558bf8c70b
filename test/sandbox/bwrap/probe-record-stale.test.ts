import {execa} from 'execa'
import fs from 'node:fs'
import path from 'node:path'
import {afterAll, beforeAll, beforeEach, describe, expect, it} from 'vitest'
import {startFakeLlm, type FakeLlm} from '../../fakes/llm-server.js'
import {BIN, fakeLlmConfig, makeHome, type TestHome} from '../../helpers/home.js'

// A remembered namespace probe (MEEPAGATEWAY_HOME/cache/namespace-probe.json) that went out of date:
// bwrap stops working while every part of the record's key stays the same. Here the start runs in
// a user namespace nested in one whose limit it already uses up (as in a rootless container or an
// LXC guest; systemd's RestrictNamespaces= or an AppArmor profile do the same), so bwrap cannot
// unshare. bwrap's exit 1 must not come back as the command's, nor stick for the record's hour:
// the record is forgotten, the layer probed again, and the command or run started again without it
// (agent `a` accepts best effort: without the layer file metadata is unprotected, and a strict agent
// is refused instead). (Found by an outside review of the record.)
const hasBwrap = fs.existsSync('/usr/bin/bwrap')
const canNest = (() => {
  try {
    return (
      fs.readFileSync('/proc/sys/user/max_user_namespaces', 'utf8').trim() !== '0' && fs.existsSync('/usr/bin/unshare')
    )
  } catch {
    return false
  }
})()

describe.skipIf(process.platform !== 'linux' || !hasBwrap || !canNest)(
  'a remembered namespace probe after bwrap stopped working',
  () => {
    let llm: FakeLlm
    let home: TestHome
    let record: string
    let limit: string
    beforeAll(async () => {
      llm = await startFakeLlm()
      home = makeHome(fakeLlmConfig(llm.openaiBaseUrl, [{id: 'a', file_access: {best_effort: true}}, {id: 'strict'}]))
      record = path.join(home.home, 'cache', 'namespace-probe.json')
      limit = fs.readFileSync('/proc/sys/user/max_user_namespaces', 'utf8').trim()
    })
    afterAll(async () => {
      home.cleanup()
      await llm.close()
    })
    beforeEach(() => llm.reset())

    const env = () => ({
      MEEPAGATEWAY_HOME: home.home,
      FAKE_LLM_KEY: 'sk-fake-test-key-123456',
      PATH: process.env.PATH ?? '/usr/bin:/bin',
    })
    /** A start that records the layer's success, where bwrap works. */
    async function recordSuccess() {
      const ok = await execa(process.execPath, [BIN, 'sandbox', 'exec', '--agent', 'a', '--', 'true'], {
        env: env(),
        reject: false,
      })
      expect(ok.exitCode).toBe(0)
      expect(JSON.parse(fs.readFileSync(record, 'utf8'))).toMatchObject({answer: true})
    }
    /**
     * argv of the CLI inside user namespace B, nested in A whose limit (1) B already uses: bwrap
     * cannot unshare there.
     */
    function whereBwrapFails(cliArgs: string[]) {
      const quoted = [process.execPath, BIN, ...cliArgs].map((arg) => `'${arg.replace(/'/g, "'\\''")}'`).join(' ')
      const inner = `echo ${limit} > /proc/sys/user/max_user_namespaces && exec ${quoted}`
      return execa(
        'unshare',
        [
          '-U',
          '-r',
          'sh',
          '-c',
          `echo 1 > /proc/sys/user/max_user_namespaces && exec unshare -U -r sh -c "${inner.replace(/(["$`\\])/g, '\\$1')}"`,
        ],
        {env: env(), reject: false, timeout: 30_000},
      )
    }

    it('sandbox exec: the command runs once, without the layer, and the record is forgotten', async () => {
      await recordSuccess()
      const marker = path.join(home.workspace('a'), 'runs')
      const result = await whereBwrapFails([
        'sandbox',
        'exec',
        '--agent',
        'a',
        '--',
        'sh',
        '-c',
        'echo ran >> runs; echo ran',
      ])
      expect(result, result.stderr).toMatchObject({exitCode: 0, stdout: 'ran'})
      expect(result.stderr).toContain('bubblewrap no longer creates the namespaces here')
      expect(fs.readFileSync(marker, 'utf8')).toBe('ran\n')
      expect(fs.existsSync(record)).toBe(false)
      // the next start probes (and finds the layer off): no bwrap failure, no second message
      const next = await whereBwrapFails(['sandbox', 'exec', '--agent', 'a', '--', 'sh', '-c', 'exit 3'])
      expect(next.exitCode).toBe(3)
      expect(next.stderr).not.toMatch(/^bwrap: |no longer creates/m)
    })

    it("a command's own exit 1 behind a working bwrap is its own: returned once, the record kept", async () => {
      await recordSuccess()
      const result = await execa(
        process.execPath,
        [BIN, 'sandbox', 'exec', '--agent', 'a', '--', 'sh', '-c', 'echo once >> ones; exit 1'],
        {env: env(), reject: false},
      )
      expect(result.exitCode).toBe(1)
      expect(fs.readFileSync(path.join(home.workspace('a'), 'ones'), 'utf8')).toBe('once\n')
      expect(fs.existsSync(record)).toBe(true)
    })

    it('send: the run starts again without the layer and answers', async () => {
      await recordSuccess()
      llm.setDefault({text: 'answered'})
      const result = await whereBwrapFails(['send', '--agent', 'a', 'hi'])
      expect(result, result.stderr).toMatchObject({exitCode: 0, stdout: 'answered'})
      expect(result.stderr).toContain('bubblewrap no longer creates the namespaces here')
      expect(llm.requests).toHaveLength(1)
      expect(fs.existsSync(record)).toBe(false)
    })

    it('send, strict agent: the run is refused without the layer, naming what is missing; nothing ran', async () => {
      await recordSuccess()
      llm.setDefault({text: 'answered'})
      const result = await whereBwrapFails(['send', '--agent', 'strict', 'hi'])
      expect(result.exitCode).not.toBe(0)
      expect(result.stderr.replace(/\s*›\s*/g, ' ')).toMatch(
        /file metadata outside the writable grants .* is not protected/,
      )
      expect(llm.requests).toHaveLength(0)
    })
  },
)
