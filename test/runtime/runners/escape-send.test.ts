import crypto from 'node:crypto'
import fs from 'node:fs'
import path from 'node:path'
import {afterAll, afterEach, beforeAll, beforeEach, describe, expect, it} from 'vitest'
import {startFakeLlm, type FakeLlm, type FakeToolCall} from '../../fakes/llm-server.js'
import {runCli} from '../../helpers/home.js'
import {
  CONFIG_MARKER,
  DB_MARKER,
  DENIED_MARKER,
  OPERATOR_KEY,
  OTHER_MARKER,
  loopbackListeners,
  makeEscapeWorld,
  nodeTcp,
  nodeUdp,
  requireLandlockOrSkip,
  type EscapeWorld,
} from '../../helpers/landlock-support.js'

// Criterion 9 through a full `send`: the default runner puts agent-run under the helper, the fake
// LLM scripts the tool calls an attacker-controlled model would make, and the test reads the tool
// results agent-run sent back to the model (and the host's files).
const enabled = requireLandlockOrSkip('host sandbox escape tests (send)')
// EBUSY/EROFS: the namespace layer's read-only covers over denied paths; ESRCH: a host pid does not
// exist in the run's PID namespace
const DENIED =
  /EACCES|EPERM|Permission denied|Operation not permitted|Invalid cross-device link|EXDEV|Device or resource busy|EBUSY|Read-only file system|EROFS|No such process|ESRCH/

describe.skipIf(!enabled)('send under the host sandbox', () => {
  let llm: FakeLlm
  let world: EscapeWorld
  let net: Awaited<ReturnType<typeof loopbackListeners>>
  const timeoutMarker = `meepa-timeout-${crypto.randomBytes(4).toString('hex')}`
  beforeAll(async () => {
    llm = await startFakeLlm()
    net = await loopbackListeners()
  })
  afterAll(async () => {
    net.close()
    await llm.close()
  })
  beforeEach(() => {
    llm.reset()
    world = makeEscapeWorld(llm.openaiBaseUrl, {id: 'sleepy', timeout_seconds: 3})
  })
  afterEach(() => world.cleanup())

  /** One message whose model asks for these tool calls, then answers "done"; returns each tool result. */
  const sendTools = async (agent: string, toolCalls: FakeToolCall[]) => {
    llm.enqueue({toolCalls}, {text: 'done'})
    const result = await runCli(['send', '--agent', agent, 'go'], {home: world.home, env: {HOME: world.operatorHome}})
    expect(result.stderr).not.toMatch(/E_SANDBOX|refusing/)
    expect(result.exitCode, result.stderr).toBe(0)
    const messages = llm.requests.at(-1)?.body.messages as Array<{role: string; content: string}>
    return messages.filter((message) => message.role === 'tool').map((message) => String(message.content))
  }
  const shell = (command: string): FakeToolCall => ({name: 'shell', arguments: {command}})
  const readFile = (file: string): FakeToolCall => ({name: 'read_file', arguments: {path: file}})
  const writeFile = (file: string, content = 'pwned'): FakeToolCall => ({
    name: 'write_file',
    arguments: {path: file, content},
  })

  it("blocks the agent's own tools from the operator's key, the gateway's files and other agents", async () => {
    const results = await sendTools('open', [
      readFile(world.key),
      readFile(path.join(world.home, 'config.yaml')),
      readFile(path.join(world.home, 'gateway.db')),
      readFile(path.join(world.workspace('other'), 'notes.txt')),
      writeFile(path.join(world.workspace('other'), 'notes.txt')),
      writeFile(path.join(world.root, 'outside.txt')),
      shell(
        `cat ${world.key}; cat ${world.home}/config.yaml; cat ${world.workspace('other')}/notes.txt; echo x > ${world.root}/outside2.txt`,
      ),
    ])
    expect(results).toHaveLength(7)
    for (const output of results) {
      expect(output).toMatch(DENIED)
      for (const marker of [OPERATOR_KEY, CONFIG_MARKER, DB_MARKER, OTHER_MARKER]) expect(output).not.toContain(marker)
    }
    expect(fs.readFileSync(path.join(world.workspace('other'), 'notes.txt'), 'utf8')).toBe(OTHER_MARKER)
    expect(fs.existsSync(path.join(world.root, 'outside.txt'))).toBe(false)
    expect(fs.existsSync(path.join(world.root, 'outside2.txt'))).toBe(false)
  })

  it('blocks denied paths in the workspace (read, write, rename aside, symlink swap, hard link) and planted symlinks', async () => {
    fs.symlinkSync(world.key, path.join(world.workspace('locked'), 'work', 'planted'))
    const attacks = [
      'cat private/secret.txt',
      'echo pwned > private/secret.txt',
      'mv private private-aside',
      'mv private/secret.txt work/moved.txt',
      'ln -sfn /tmp private',
      'ln private/secret.txt work/hardlink.txt',
      'cat work/planted',
    ]
    const results = await sendTools('locked', [
      readFile('private/secret.txt'),
      writeFile('private/secret.txt'),
      ...attacks.map((attack) => shell(attack)),
    ])
    expect(results).toHaveLength(2 + attacks.length)
    for (const [index, output] of results.entries()) {
      expect(output, String(index)).toMatch(DENIED)
      expect(output).not.toContain(DENIED_MARKER)
      expect(output).not.toContain(OPERATOR_KEY)
      if (index >= 2) expect(output, attacks[index - 2]).not.toMatch(/^exit code: 0\b/)
    }
    expect(fs.readFileSync(path.join(world.workspace('locked'), 'private', 'secret.txt'), 'utf8')).toBe(DENIED_MARKER)
    expect(fs.existsSync(path.join(world.workspace('locked'), 'private-aside'))).toBe(false)
  })

  it("an agent's shell sees only the run's processes, opens a pty, creates files beside a denied directory and cannot listen", async () => {
    const results = await sendTools('locked', [
      shell(`ps -e -o comm= | sort | tr '\\n' ' '; cat /proc/${process.pid}/cmdline`),
      shell(`python3 -c 'import os; m, s = os.openpty(); print("PTY", os.ttyname(s))'`),
      shell(
        'echo beside > beside.txt && mkdir newdir && mv beside.txt newdir/ && cat newdir/beside.txt && cat private/secret.txt',
      ),
      shell(`python3 -c 'import socket; socket.socket().bind(("127.0.0.1", 0))'`),
    ])
    // bwrap (the run's init), agent-run (node), the shell, ps, sort, tr: nothing of the host
    const [processes, cmdline] = results[0]!.split('\n')[1]!.split(' cat: ')
    expect(
      processes!
        .trim()
        .split(' ')
        .every((name) => ['bwrap', 'node', 'sh', 'ps', 'sort', 'tr'].includes(name)),
    ).toBe(true)
    expect(cmdline).toMatch(/No such file or directory/)
    expect(results[1]).toMatch(/^exit code: 0\b[\s\S]*PTY \/dev\/pts\/\d+/)
    expect(results[2]).toMatch(/beside/)
    expect(results[2]).toMatch(/Permission denied/)
    expect(results[2]).not.toContain(DENIED_MARKER)
    expect(fs.existsSync(path.join(world.workspace('locked'), 'newdir', 'beside.txt'))).toBe(true)
    expect(results[3]).toMatch(/Operation not permitted/)
  })

  it('keeps shell commands off the network with allow_network: false, TCP and UDP to 127.0.0.1 included', async () => {
    const results = await sendTools('locked', [shell(nodeTcp(net.tcpPort)), shell(nodeUdp(net.udpPort))])
    for (const output of results) {
      expect(output).toMatch(/^exit code: [1-9]/)
      expect(output).toMatch(/EPERM/) // socket() itself is refused
      expect(output).not.toMatch(/CONNECTED|SENT/)
    }
    await new Promise((resolve) => setTimeout(resolve, 200))
    expect(net.tcpConnections()).toBe(0)
    expect(net.udpMessages()).toBe(0)
  })

  it("keeps shell commands out of agent-run's memory (it holds the agent's secrets) and its signals", async () => {
    const results = await sendTools('open', [
      shell('cat /proc/$PPID/maps'),
      shell(
        `/usr/bin/python3 -c "import re,sys; pid=int(sys.argv[1]); maps=open(f'/proc/{pid}/maps').read(); print('READ MEMORY')" $PPID`,
      ),
      shell('kill -0 $PPID'),
    ])
    for (const output of results) {
      expect(output).toMatch(/^exit code: [1-9]/)
      expect(output).toMatch(DENIED)
      expect(output).not.toContain('READ MEMORY')
      expect(output).not.toContain('sk-fake-test-key-123456')
    }
  })

  it('gives shell commands no provider key in their environment', async () => {
    const [output] = await sendTools('open', [
      shell('env; cat /proc/$$/environ | tr "\\0" "\\n"; cat /proc/$PPID/environ'),
    ])
    expect(output).not.toContain('FAKE_LLM_KEY')
    expect(output).not.toContain('sk-fake-test-key-123456')
    expect(output).toContain(`HOME=${world.workspace('open')}`)
  })

  it('lets the agent work: workspace, temp dir, system tools, allow_read and allow_read_write, network when allowed', async () => {
    const open = await sendTools('open', [
      writeFile('notes/today.md', 'hello'),
      shell(
        'cat notes/today.md && echo tmp > "$TMPDIR/t" && cat "$TMPDIR/t" && ls /usr/bin | grep -q . && cat /etc/resolv.conf > /dev/null && echo OK',
      ),
      shell(nodeTcp(net.tcpPort)),
    ])
    expect(open[0]).toContain('wrote 5 bytes')
    expect(open[1]).toBe('exit code: 0\nhellotmp\nOK')
    expect(open[2]).toContain('CONNECTED')
    const locked = await sendTools('locked', [
      readFile(path.join(world.shared.read, 'readme.txt')),
      shell(`echo more >> ${path.join(world.shared.readWrite, 'data.txt')} && echo edited > work/draft.txt && echo OK`),
    ])
    expect(locked[0]).toBe('shared read-only data')
    expect(locked[1]).toBe('exit code: 0\nOK')
  })

  it('kills the whole process tree at the timeout: no late sentinel, no surviving process', async () => {
    const ws = world.workspace('sleepy')
    // a background child and the foreground command both wake up after the 3 s deadline
    // and a third moves to a process group of its own first (setpgid is allowed, setsid is not)
    const regroup = `/usr/bin/python3 -c "import os,sys,time; os.setpgrp(); open('pg-started','w').write(str(os.getpgrp())); time.sleep(6); open('pg-sentinel','w').write('late')" ${timeoutMarker}`
    const command = `sh -c 'sleep 6; echo late > bg-sentinel' ${timeoutMarker} & ${regroup} & sh -c 'sleep 6; echo late > fg-sentinel' ${timeoutMarker}`
    llm.enqueue({toolCalls: [shell(command)]}, {text: 'done'})
    const started = Date.now()
    const result = await runCli(['send', '--agent', 'sleepy', 'go'], {
      home: world.home,
      env: {HOME: world.operatorHome},
    })
    expect(result.exitCode).toBe(7)
    expect(result.stderr).toMatch(/longer than 3 s/)
    expect(Date.now() - started).toBeLessThan(6000 + 3000)
    expect(survivors(timeoutMarker)).toEqual([])
    await new Promise((resolve) => setTimeout(resolve, 4500))
    expect(fs.existsSync(path.join(ws, 'bg-sentinel'))).toBe(false)
    expect(fs.existsSync(path.join(ws, 'fg-sentinel'))).toBe(false)
    expect(fs.existsSync(path.join(ws, 'pg-sentinel'))).toBe(false)
    // it did run, in a group of its own
    if (fs.existsSync('/usr/bin/python3')) expect(fs.existsSync(path.join(ws, 'pg-started'))).toBe(true)
    expect(survivors(timeoutMarker)).toEqual([])
  }, 30_000)

  it("keeps the shell tool's own timeout working inside the sandbox (the command and its children are killed)", async () => {
    llm.enqueue(
      {
        toolCalls: [
          {name: 'shell', arguments: {command: `sleep 20 & sleep 20; echo after-${timeoutMarker}`, timeout_seconds: 2}},
        ],
      },
      {text: 'done'},
    )
    const started = Date.now()
    const result = await runCli(['send', '--agent', 'open', 'go'], {home: world.home, env: {HOME: world.operatorHome}})
    expect(result.exitCode, result.stderr).toBe(0)
    expect(Date.now() - started).toBeLessThan(15_000)
    const output = String(llm.requests.at(-1)?.body.messages.at(-1).content)
    expect(output).toMatch(/^command timed out after 2 s and was killed/)
    expect(output).not.toContain(`after-${timeoutMarker}`)
  }, 30_000)
})

/** Processes whose command line carries the marker. */
function survivors(marker: string): string[] {
  const found: string[] = []
  for (const pid of fs.readdirSync('/proc').filter((name) => /^\d+$/.test(name))) {
    try {
      const cmdline = fs.readFileSync(`/proc/${pid}/cmdline`, 'utf8').replaceAll('\0', ' ')
      if (cmdline.includes(marker)) found.push(`${pid}: ${cmdline}`)
    } catch {
      // exited meanwhile
    }
  }
  return found
}
