import fs from 'node:fs'
import os from 'node:os'
import path from 'node:path'
import {afterAll, beforeAll, describe, expect, it} from 'vitest'
import {startFakeLlm, type FakeLlm} from '../../fakes/llm-server.js'
import {fakeLlmConfig, makeHome, runCli, type TestHome} from '../../helpers/home.js'
import {requireLandlockOrSkip} from '../../helpers/landlock-support.js'

// With the namespace layer a run's TMPDIR is a tmpfs of its own mount namespace, limits.disk large:
// whatever shape a hostile run leaves there (deep past PATH_MAX, half a million entries) goes with
// the namespace, and nothing of it lands on the host's disk.
const enabled =
  requireLandlockOrSkip('private tmpfs TMPDIR') && fs.existsSync('/usr/bin/bwrap') && fs.existsSync('/usr/bin/python3')

describe.skipIf(!enabled)("a run's TMPDIR is a private, size-limited tmpfs", {timeout: 180_000}, () => {
  let llm: FakeLlm
  let home: TestHome
  /** The CLI's os.tmpdir(), where each run makes its private TMPDIR: nothing may be left in it. */
  let tmpRoot: string
  const env = () => ({TMPDIR: tmpRoot})
  beforeAll(async () => {
    llm = await startFakeLlm()
    tmpRoot = fs.mkdtempSync(path.join(os.tmpdir(), 'meepa-tmproot-'))
    home = makeHome(
      fakeLlmConfig(llm.openaiBaseUrl, [
        {id: 'small', limits: {disk: '8m'}},
        // tmpfs entries are memory: half a million of them need more than the default 512m
        {id: 'deep', limits: {memory: '2g', disk: '1g'}},
      ]),
    )
  })
  afterAll(async () => {
    home.cleanup()
    fs.rmSync(tmpRoot, {recursive: true, force: true})
    await llm.close()
  })

  it('is limits.disk large: a file past it fails with ENOSPC, and nothing reaches the host', async () => {
    const result = await runCli(
      [
        'sandbox',
        'exec',
        '--agent',
        'small',
        '--',
        '/bin/sh',
        '-c',
        'df -k "$TMPDIR" | tail -1; head -c 9m /dev/zero > "$TMPDIR/big"; echo rc=$?',
      ],
      {home: home.home, env: env()},
    )
    expect(result.stdout).toMatch(/^tmpfs\s+8192\s/m)
    expect(result.stdout).toContain('rc=1')
    expect(result.stderr).toContain('No space left on device')
    expect(fs.readdirSync(tmpRoot)).toEqual([])
  })

  it('a 500,000-entry tree deeper than PATH_MAX left behind by a run is gone, and its reply is delivered', async () => {
    // 25 levels of 200-character names (5,000 characters), 20,000 empty files at each level
    const plant = [
      'import os',
      'os.chdir(os.environ["TMPDIR"])',
      'for level in range(25):',
      '    for i in range(20000):',
      '        os.close(os.open(str(i), os.O_CREAT | os.O_WRONLY))',
      '    os.mkdir("d" * 200)',
      '    os.chdir("d" * 200)',
      'print("planted", 25 * 20000 + 25, "entries,", 25 * 201, "characters deep")',
    ].join('\n')
    llm.enqueue(
      {toolCalls: [{name: 'shell', arguments: {command: `/usr/bin/python3 -c '${plant}'`}}]},
      {text: 'left it there'},
    )
    const result = await runCli(['send', '--agent', 'deep', 'plant a tree'], {
      home: home.home,
      env: env(),
      timeoutMs: 150_000,
    })
    expect(result.exitCode, result.stderr).toBe(0)
    expect(result.stdout.trim()).toBe('left it there')
    const tool = (llm.requests.at(-1)?.body.messages as Array<{role: string; content: string}>).findLast(
      (message) => message.role === 'tool',
    )?.content
    expect(tool).toContain('planted 500025 entries, 5025 characters deep')
    expect(fs.readdirSync(tmpRoot)).toEqual([])
    expect(fs.readdirSync(path.join(home.home, 'agents', 'deep'))).not.toContain('d'.repeat(200))
  })
})
