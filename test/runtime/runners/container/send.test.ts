import {execa} from 'execa'
import fs from 'node:fs'
import path from 'node:path'
import {afterAll, beforeAll, describe, expect, it} from 'vitest'
import {startFakeLlm, type FakeLlm, type FakeRequest} from '../../../fakes/llm-server.js'
import {fakeLlmConfig, makeHome, runCli, usedBytes, type CliResult, type TestHome} from '../../../helpers/home.js'
import {homeLabel} from '../../../../src/sandbox/docker/home-label.js'
import {buildDockerRunArgs} from '../../../../src/sandbox/docker/run-args.js'
import {containerUser} from '../../../../src/runtime/runners/container/runner.js'
import {describeWithDocker, dockerRecorder, realDockerPath, type DockerRecorder} from '../../../helpers/docker-env.js'

/*
 * Container mode through the path a user takes: the built CLI, `send`, the container runner,
 * `docker run` of the isolation image, agent-run inside, the real SDK, the fake LLM. Every
 * isolation property is checked by ATTEMPTING the forbidden thing from a scripted shell tool call.
 *
 * The LLM is called by the runner on the host (agent-run asks over its stdin/stdout), so `network:
 * none` works; most agents here use `network: host` only so their probes can show what a shell sees.
 */

const SECRET = 'ghp-very-secret-token-4242'
/** The uid:gid containers run as when container_mode.user is unset. */
const RUN_USER = containerUser(undefined)
/** Tries a TCP listen and a UDP bind on 127.0.0.1, printing the error code of each (or LISTENING). */
const LISTEN_PROBE = [
  'const net = require("net"), dgram = require("dgram");',
  'net.createServer().listen(0, "127.0.0.1", () => { console.log("tcp LISTENING"); udp() }).on("error", (e) => { console.log("tcp", e.code); udp() });',
  'function udp() { const s = dgram.createSocket("udp4"); s.on("error", (e) => { console.log("udp", e.code); process.exit(0) }); s.bind(0, "127.0.0.1", () => { console.log("udp LISTENING"); process.exit(0) }) }',
].join(' ')
const PROVIDER_KEY = 'sk-fake-test-key-123456'

/** The content of the tool result the agent sent back to the LLM in the request after the call. */
function toolResult(llm: FakeLlm, index = 1): string {
  const request = llm.requests[index] as FakeRequest | undefined
  return String(request?.body.messages.at(-1)?.content ?? '')
}

/** Scripts one shell tool call, then a final answer quoting its output. */
function scriptShell(llm: FakeLlm, command: string, timeoutSeconds = 60): void {
  llm.enqueue({toolCalls: [{name: 'shell', arguments: {command, timeout_seconds: timeoutSeconds}}]}, (request) => ({
    text: `tool said: ${request.body.messages.at(-1).content}`,
  }))
}

/** Text between `== name ==` and the next marker in a probe's output. */
function section(output: string, name: string): string {
  const start = output.indexOf(`== ${name} ==`)
  if (start < 0) return ''
  const rest = output.slice(start + name.length + 6)
  const end = rest.indexOf('\n== ')
  return (end < 0 ? rest : rest.slice(0, end)).trim()
}

describeWithDocker('container mode: a fresh hardened container per message (real engine)', () => {
  let llm: FakeLlm
  let recorder: DockerRecorder
  const homes: TestHome[] = []

  const containerAgent = (
    id: string,
    containerMode: Record<string, unknown> = {},
    extra: Record<string, unknown> = {},
  ) => ({
    id,
    secrets: ['GITHUB_TOKEN'],
    container_mode: {enabled: true, network: 'host', memory_limit: '512m', timeout_seconds: 60, ...containerMode},
    ...extra,
  })
  const newHome = (agents: Array<Record<string, unknown>>, imageConfig: Record<string, unknown> = {}) => {
    const home = makeHome(
      fakeLlmConfig(llm.openaiBaseUrl, agents, {
        image_config: {inject_credentials_env: false, inject_secrets_env: false, ...imageConfig},
      }),
    )
    homes.push(home)
    return home
  }
  const send = (home: TestHome, agent: string, message: string, ...flags: string[]): Promise<CliResult> =>
    runCli(['send', '--agent', agent, ...flags, message], {
      home: home.home,
      env: {GITHUB_TOKEN: SECRET, MEEPAGATEWAY_DOCKER_BIN: recorder.bin},
      timeoutMs: 240_000,
    })
  const gatewayContainers = async (home: TestHome) =>
    (await execa('docker', ['ps', '-a', '-q', '--filter', `label=meepagateway.home=${homeLabel(home.home)}`])).stdout
      .split('\n')
      .filter(Boolean)

  beforeAll(async () => {
    llm = await startFakeLlm()
    recorder = dockerRecorder(fs.mkdtempSync(path.join(process.env.TMPDIR ?? '/tmp', 'meepa-docker-rec-')))
  })
  afterAll(async () => {
    await llm.close()
    for (const home of homes) home.cleanup()
  })

  describe('one probe run, injection off', () => {
    let home: TestHome
    let result: CliResult
    let probe: string

    beforeAll(async () => {
      llm.reset()
      home = newHome([containerAgent('box')])
      // a file the gateway (root here) made earlier: the container's uid must still be able to write it
      fs.mkdirSync(home.workspace('box'), {recursive: true})
      fs.writeFileSync(path.join(home.workspace('box'), 'made-by-gateway.txt'), 'old\n', {mode: 0o644})
      scriptShell(
        llm,
        [
          'echo "== root =="; touch /escape 2>&1 || true',
          'echo "== status =="; grep -E "^(CapEff|CapBnd|NoNewPrivs|Seccomp):" /proc/self/status',
          'echo "== memory =="; cat /sys/fs/cgroup/memory/memory.limit_in_bytes 2>/dev/null || cat /sys/fs/cgroup/memory.max',
          'echo "== tmp-write =="; echo ok > /tmp/probe && cat /tmp/probe',
          'echo "== tmp-size =="; df -k /tmp | tail -1 | awk "{print \\$2}"',
          'echo "== tmp-cap =="; { head -c 300000000 /dev/zero > /tmp/big; } 2>&1 || true; rm -f /tmp/big',
          'echo "== workspace =="; echo persisted > /workspace/from-container.txt && echo written; pwd; echo "$HOME $TMPDIR"',
          'echo "== socket =="; for s in /var/run/docker.sock /run/docker.sock; do test -e $s && echo "present $s"; done; echo checked',
          'echo "== environ =="; cat /proc/[0-9]*/environ 2>/dev/null | tr "\\0" "\\n" | sort -u',
          'echo "== user =="; id -u; id -g',
          'echo "== gateway-file =="; echo new >> /workspace/made-by-gateway.txt && echo appended',
          'echo "== cpu =="; cat /sys/fs/cgroup/cpu/cpu.cfs_quota_us /sys/fs/cgroup/cpu/cpu.cfs_period_us 2>/dev/null || cat /sys/fs/cgroup/cpu.max',
          `echo "== listen =="; node -e '${LISTEN_PROBE}'`,
          'echo "== end =="',
        ].join('\n'),
      )
      recorder.clear()
      result = await send(home, 'box', 'probe your sandbox', '--json')
      probe = toolResult(llm)
    })

    it('answers through the container', () => {
      expect(result.exitCode).toBe(0)
      expect(JSON.parse(result.stdout)).toMatchObject({
        ok: true,
        reply: {content: expect.stringContaining('tool said: exit code: 0')},
      })
    })

    it('has a read-only root: writing to / fails', () => {
      expect(section(probe, 'root')).toContain('Read-only file system')
    })

    it('has no capabilities and no way to gain privileges (CapEff 0, NoNewPrivs 1, seccomp on)', () => {
      const status = section(probe, 'status')
      expect(status).toMatch(/CapEff:\s+0000000000000000/)
      expect(status).toMatch(/CapBnd:\s+0000000000000000/)
      expect(status).toMatch(/NoNewPrivs:\s+1/)
      expect(status).toMatch(/Seccomp:\s+2/)
    })

    it('sees its memory limit in its own cgroup', () => {
      expect(section(probe, 'memory')).toBe(String(512 * 1024 * 1024))
    })

    it('has a writable /tmp capped at 256 MB', () => {
      expect(section(probe, 'tmp-write')).toBe('ok')
      expect(section(probe, 'tmp-size')).toBe(String(256 * 1024))
      expect(section(probe, 'tmp-cap')).toContain('No space left on device')
    })

    it('works in /workspace as HOME; a file written there persists on the host, owned by the run uid', () => {
      expect(section(probe, 'workspace')).toBe('written\n/workspace\n/workspace /tmp')
      const file = path.join(home.workspace('box'), 'from-container.txt')
      expect(fs.readFileSync(file, 'utf8')).toBe('persisted\n')
      expect(fs.statSync(file).uid).toBe(RUN_USER.uid)
      expect(fs.statSync(file).gid).toBe(RUN_USER.gid)
    })

    it('never runs as uid 0 by default (a root gateway picks an unprivileged uid), and files the gateway made stay writable', () => {
      expect(section(probe, 'user')).toBe(`${RUN_USER.uid}\n${RUN_USER.gid}`)
      expect(RUN_USER.uid).not.toBe(0)
      expect(section(probe, 'gateway-file')).toBe('appended')
      expect(fs.readFileSync(path.join(home.workspace('box'), 'made-by-gateway.txt'), 'utf8')).toBe('old\nnew\n')
    })

    it('is held to one CPU by default (--cpus 1)', () => {
      const cpu = section(probe, 'cpu').split(/\s+/)
      expect(Number(cpu[0]) / Number(cpu[1])).toBe(1)
    })

    it('cannot listen on a port, even with network: host (allow_listen is off)', () => {
      expect(section(probe, 'listen')).toBe('tcp EPERM\nudp EPERM')
    })

    it('has no Docker socket', () => {
      expect(section(probe, 'socket')).toBe('checked')
    })

    it('with injection off, no secret is in /proc/1/environ or any process environment', () => {
      const environ = section(probe, 'environ')
      expect(environ).toContain('HOME=/workspace') // the probe really read the environments
      for (const leak of [SECRET, PROVIDER_KEY, 'GITHUB_TOKEN', 'FAKE_LLM_KEY', '[REDACTED]'])
        expect(environ).not.toContain(leak)
    })

    it('never puts a secret in the docker argv', () => {
      const calls = recorder.calls()
      expect(calls.some((call) => call[0] === 'run' && call.includes('--read-only'))).toBe(true)
      for (const call of calls)
        for (const arg of call) for (const secret of [SECRET, PROVIDER_KEY]) expect(arg).not.toContain(secret)
    })

    it('leaves no container behind', async () => {
      // after a successful run the container is removed once the reply is out: allow it a moment
      for (let i = 0; i < 50 && (await gatewayContainers(home)).length > 0; i++)
        await new Promise((resolve) => setTimeout(resolve, 100))
      expect(await gatewayContainers(home)).toEqual([])
    })
  })

  it('with allow_listen: true and container_mode.user "0", listens (network: host) and runs as root as configured', async () => {
    llm.reset()
    const home = newHome([containerAgent('server', {user: '0'}, {file_access: {allow_listen: true}})])
    scriptShell(llm, `id -u; node -e '${LISTEN_PROBE}'`)
    const result = await send(home, 'server', 'listen', '--json')
    expect(result.exitCode, result.stdout + result.stderr).toBe(0)
    expect(toolResult(llm)).toContain('0\ntcp LISTENING\nudp LISTENING')
  })

  it('with inject_secrets_env and inject_credentials_env on, sets them in the container env (still not in argv)', async () => {
    llm.reset()
    const home = newHome([containerAgent('box')], {inject_secrets_env: true, inject_credentials_env: true})
    // the shell command's own environment: injected secrets are for the agent's tools (gh, git...)
    scriptShell(llm, 'env')
    recorder.clear()
    const result = await send(home, 'box', 'show your env', '--json')
    expect(result.exitCode).toBe(0)
    // agent-run redacts secret values from tool output before it reaches the LLM: the names prove
    // the variables were set, the masked values prove they carried the secrets.
    expect(toolResult(llm)).toContain('GITHUB_TOKEN=[REDACTED]')
    expect(toolResult(llm)).toContain('FAKE_LLM_KEY=[REDACTED]')
    for (const call of recorder.calls()) for (const arg of call) expect(arg).not.toContain(SECRET)
    expect(recorder.calls().find((call) => call[0] === 'run')).toEqual(expect.arrayContaining(['-e', 'GITHUB_TOKEN']))
  })

  it("a shell command cannot read agent-run's memory (/proc/PID/mem)", async () => {
    llm.reset()
    // injection off: the key is not in the container at all (test/e2e/no-key-in-sandbox.test.ts);
    // this checks the wall around agent-run
    const home = newHome([containerAgent('box')])
    // The needle is assembled at run time, so the command text itself never holds the key.
    scriptShell(
      llm,
      `node -e '
      const fs = require("fs"); const needle = Buffer.from(${JSON.stringify(PROVIDER_KEY.split('-'))}.join("-"))
      const pid = fs.readdirSync("/proc").find((p) => /^[0-9]+$/.test(p) && p !== "1" &&
        fs.readFileSync("/proc/" + p + "/cmdline", "utf8").split("\\0").filter(Boolean).pop() === "agent-" + "run")
      let verdict = "NOT FOUND", error = "none", chunks = 0
      try {
        const fd = fs.openSync("/proc/" + pid + "/mem", "r"); const buf = Buffer.alloc(1 << 20)
        for (const line of fs.readFileSync("/proc/" + pid + "/maps", "utf8").split("\\n")) {
          const m = /^([0-9a-f]+)-([0-9a-f]+) rw/.exec(line); if (!m) continue
          for (let at = parseInt(m[1], 16), end = parseInt(m[2], 16); at < end; at += (1 << 20) - 64) {
            try { const n = fs.readSync(fd, buf, 0, Math.min(1 << 20, end - at), at); chunks++; if (buf.subarray(0, n).includes(needle)) verdict = "LEAKED" } catch (e) { error = e.code }
          }
        }
      } catch (e) { error = e.code }
      console.log("agent-run pid", pid, "chunks", chunks, "error", error, verdict)'`,
    )
    const result = await send(home, 'box', 'read your parent', '--json')
    expect(result.exitCode).toBe(0)
    const output = toolResult(llm)
    expect(output).toMatch(/agent-run pid \d+ /) // the probe found its target
    expect(output).toContain('error EACCES')
    expect(output).toContain('NOT FOUND')
    expect(output).not.toContain('[REDACTED]')
  })

  it('with network: none, a conversation with tool calls works (the host calls the LLM) while the agent reaches nothing, the LLM included', async () => {
    llm.reset()
    const home = newHome([containerAgent('offline', {network: 'none'})])
    recorder.clear()
    const connect = `node -e 'const s=require("net").connect(${llm.port},"127.0.0.1");s.on("connect",()=>{console.log("CONNECTED");process.exit(0)});s.on("error",e=>{console.log("refused",e.code);process.exit(1)})'`
    llm.enqueue(
      {toolCalls: [{name: 'write_file', arguments: {path: 'offline.txt', content: 'written without a network'}}]},
      {toolCalls: [{name: 'shell', arguments: {command: connect}}]},
      (request) => ({text: `tool said: ${request.body.messages.at(-1).content}`}),
    )
    const result = await send(home, 'offline', 'hello', '--json')
    expect(result.exitCode).toBe(0)
    const output = JSON.parse(result.stdout)
    expect(output).toMatchObject({ok: true, iterations: 3})
    expect(output.reply.content).toMatch(/refused E(CONNREFUSED|NETUNREACH)/)
    expect(output.reply.content).not.toContain('CONNECTED')
    expect(fs.readFileSync(path.join(home.workspace('offline'), 'offline.txt'), 'utf8')).toBe(
      'written without a network',
    )
    expect(llm.requests).toHaveLength(3)
    const runs = recorder.calls().filter((args) => args[0] === 'run')
    expect(runs.at(-1)?.join(' ')).toContain('--network none')
  })

  it('with network: none, only the loopback interface exists (the runner argv, with a probe command)', async () => {
    const image = (
      await execa('docker', ['image', 'ls', '--format', '{{.Repository}}:{{.Tag}}', 'meepagateway-isolated'])
    ).stdout
      .split('\n')
      .find((ref) => ref.endsWith('-debian-bookworm-slim'))
    expect(image).toBeDefined()
    const workspace = fs.mkdtempSync(path.join(process.env.TMPDIR ?? '/tmp', 'meepa-netns-'))
    const args = buildDockerRunArgs({
      name: `meepa-netprobe-${process.pid}`,
      image: image!,
      workspace,
      uid: process.getuid!(),
      gid: process.getgid!(),
      memoryLimit: '128m',
      pidsLimit: 64,
      cpus: 1,
      network: 'none',
      listen: 'deny',
      labels: {meepagateway: '1'},
      forwardEnv: [],
      entrypoint: '/bin/sh',
      command: ['-c', "tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '"],
    })
    const run = await execa('docker', args, {reject: false, input: '', timeout: 60_000})
    await execa('docker', ['rm', '-f', `meepa-netprobe-${process.pid}`], {reject: false})
    fs.rmSync(workspace, {recursive: true, force: true})
    expect(run.exitCode).toBe(0)
    expect(run.stdout.trim().split('\n')).toEqual(['lo'])
  })

  it('past timeout_seconds, kills the container: a timeout reply, no container left, no late side effect', async () => {
    llm.reset()
    const home = newHome([containerAgent('slow', {timeout_seconds: 3})])
    scriptShell(llm, 'sleep 6; touch /workspace/SENTINEL')
    const started = Date.now()
    const result = await send(home, 'slow', 'take your time', '--json')
    expect(Date.now() - started).toBeLessThan(20_000)
    expect(result.exitCode).toBe(7)
    const {error} = JSON.parse(result.stdout)
    expect(error.code).toBe('E_TIMEOUT')
    expect(error.message).toMatch(/longer than 3 s.*killed/)
    expect(await gatewayContainers(home)).toEqual([])
    await new Promise((resolve) => setTimeout(resolve, 5000))
    expect(fs.existsSync(path.join(home.workspace('slow'), 'SENTINEL'))).toBe(false)
  })

  // Issue 27 criterion 2: Docker binds the workspace path, so the container writes to its volume
  // (src/runtime/workspace/volume.ts): the kernel ends every write at limits.disk
  it('the workspace inside the container is its volume: writing past limits.disk fails with ENOSPC', async () => {
    llm.reset()
    scriptShell(llm, 'head -c 40m /dev/zero > big; echo "exit $?"')
    const home = newHome([containerAgent('filler', {}, {limits: {disk: '8m'}})])
    const result = await send(home, 'filler', 'fill the disk', '--json')
    expect(result.stdout).toContain('No space left on device')
    const workspace = home.workspace('filler')
    expect(fs.statSync(workspace).dev).not.toBe(fs.statSync(home.home).dev)
    expect(usedBytes(workspace)).toBeLessThanOrEqual(8 * 1024 * 1024)
  })

  it('files below a path longer than PATH_MAX stop at limits.disk too', async () => {
    llm.reset()
    // perl (perl-base is in the Debian base image): the shell's cd builds full paths, which stop at PATH_MAX
    const hide =
      'for (1..25) { mkdir "x" x 200 or die; chdir "x" x 200 or die } for (1..10) { open my $f, ">", "big$_" or die; print $f "\\0" x (7 << 20) or die "write: $!" } print "hidden"'
    scriptShell(llm, `perl -e '${hide}'; echo " exit $?"`)
    const home = newHome([containerAgent('filler', {}, {limits: {disk: '8m'}})])
    // the deep tree is inside the volume: the home's clean-up unmounts it and removes the image
    const result = await send(home, 'filler', 'hide files deep', '--json')
    expect(result.stdout).toMatch(/No space left on device|E_DISK/)
    const workspace = home.workspace('filler')
    expect(usedBytes(workspace)).toBeLessThanOrEqual(8 * 1024 * 1024)
    // the files are down the deep path, not beside it
    expect(fs.readdirSync(workspace).filter((entry) => entry.startsWith('big'))).toEqual([])
  })

  describe('out of memory', () => {
    const expectOutOfMemory = async (memoryLimit: string) => {
      const home = newHome([containerAgent('hungry', {memory_limit: memoryLimit})])
      const result = await send(home, 'hungry', 'allocate a lot', '--json')
      expect(result.exitCode).toBe(7)
      const {error} = JSON.parse(result.stdout)
      expect(error.code).toBe('E_OOM')
      expect(error.message).toContain(memoryLimit)
      expect(await gatewayContainers(home)).toEqual([])
    }

    it('an allocation past memory_limit is reported as out of memory', async () => {
      llm.reset()
      scriptShell(llm, 'node -e "const kept = []; for (;;) kept.push(Buffer.alloc(1e7, 1))"; echo survived')
      await expectOutOfMemory('128m')
    })

    // agent-run reports a command killed for memory; this is the case where nothing inside can
    // (8m: since its bundle is minified and read as latin1, agent-run runs whole in 16m; Docker's floor is 6m)
    it('a memory_limit too small for agent-run itself is reported as out of memory, not as a crash', async () => {
      llm.reset()
      await expectOutOfMemory('8m')
    })
  })

  describe('concurrency', () => {
    /** Start and end (ms) of each run, as the runs themselves recorded them in the workspace. */
    const spans = (home: TestHome, agent: string) =>
      fs
        .readFileSync(path.join(home.workspace(agent), 'spans'), 'utf8')
        .trim()
        .split('\n')
        .map((line) => line.split(' ').map(Number) as [number, number])
    const overlap = ([a0, a1]: [number, number], [b0, b1]: [number, number]) => a0 < b1 && b0 < a1

    beforeAll(() => {
      llm.reset()
      // any number of runs in any order: a tool call first, then a final answer
      llm.setDefault((request) =>
        request.body.messages.at(-1).role === 'tool'
          ? {text: 'done'}
          : {
              toolCalls: [
                {
                  name: 'shell',
                  arguments: {command: 's=$(date +%s%3N); sleep 2; echo "$s $(date +%s%3N)" >> /workspace/spans'},
                },
              ],
            },
      )
    })
    afterAll(() => llm.setDefault(undefined))

    it('two messages to one agent run one after the other', async () => {
      const home = newHome([containerAgent('solo')])
      const results = await Promise.all([send(home, 'solo', 'first'), send(home, 'solo', 'second')])
      expect(
        results.map((result) => result.exitCode),
        JSON.stringify(results.map((result) => result.stderr.slice(-600))),
      ).toEqual([0, 0])
      const [first, second] = spans(home, 'solo')
      expect(first && second).toBeTruthy()
      expect(overlap(first!, second!)).toBe(false)
    })

    it('two agents run at the same time', async () => {
      const home = newHome([containerAgent('left'), containerAgent('right')])
      const results = await Promise.all([send(home, 'left', 'go'), send(home, 'right', 'go')])
      expect(results.map((result) => result.exitCode)).toEqual([0, 0])
      expect(overlap(spans(home, 'left')[0]!, spans(home, 'right')[0]!)).toBe(true)
    })
  })
})

describe.skipIf(!fs.existsSync(realDockerPath()))('container mode without a reachable engine', () => {
  it('a send to a container agent fails with E_DOCKER_DOWN and how to start the engine', async () => {
    const home = makeHome(fakeLlmConfig('http://127.0.0.1:9/v1', [{id: 'box', container_mode: {enabled: true}}]))
    try {
      const result = await runCli(['send', '--agent', 'box', 'hello', '--json'], {
        home: home.home,
        env: {DOCKER_HOST: `unix://${home.home}/no-engine.sock`},
      })
      expect(result.exitCode).toBe(10)
      const {error} = JSON.parse(result.stdout)
      expect(error.code).toBe('E_DOCKER_DOWN')
      expect(error.message).toContain('no-engine.sock')
    } finally {
      home.cleanup()
    }
  })
})
