import fs from 'node:fs'
import net from 'node:net'
import path from 'node:path'
import {afterAll, beforeAll, expect, it} from 'vitest'
import {startFakeLlm, type FakeLlm} from '../../../fakes/llm-server.js'
import {shellScripted} from '../../../helpers/fake-llm-for-tests.js'
import {waitFor} from '../../../helpers/wait-for.js'
import {freePort} from '../../../helpers/free-port.js'
import {fakeLlmConfig, makeHome, runCli, type TestHome} from '../../../helpers/home.js'
import {startServe, type ServeProcess} from '../../../helpers/serve.js'
import {describeWithPodman, ensurePodmanBaseImage, PODMAN_HOST, podmanDocker} from '../../../helpers/podman-engine.js'
import {execa, type ResultPromise} from 'execa'
import os from 'node:os'
import {makeCertificates} from '../../../helpers/own-engine.js'
import {homeLabel} from '../../../../src/sandbox/docker/home-label.js'
import {syncedVolume} from '../../../../src/runtime/runners/container/workspace-sync.js'
import {limitGaps, probedPodmanHost} from '../../../../src/runtime/container/podman-limits.js'
import {startOwnSshd, type OwnSshd} from '../../../helpers/own-sshd.js'
import {healthzNamesDown} from '../../../helpers/engine-scan.js'

/*
 * The rootless Podman engine of scripts/ci/podman-up.sh (a non-root user's `podman system
 * service`), driven through its Docker-compatible socket by the same docker CLI path, as three
 * engines of a gateway served by bin/run.js: `podman` (best_effort: true), `strict` (the same
 * socket, without it) and `far`: the same engine reached as a remote one, over tcp://127.0.0.1 with
 * mutual TLS through a TLS proxy (socat; Podman's service has no TLS of its own); `viassh`: the
 * same engine over ssh:// (an sshd of the test's own on 127.0.0.1, whose `podman system
 * dial-stdio` reaches that service), and `podwrong`, the same sshd with a host key the gateway does
 * not know. What Podman
 * cannot apply on this machine's cgroups is read from the engine itself; each hardening flag is
 * checked inside the running container by attempting what it forbids.
 */

const KEY = 'sk-fake-test-key-123456' // what startServe gives FAKE_LLM_KEY
const FILE_SIZE_LIMIT = 8 * 1024 * 1024 // limits.disk: 8m

describeWithPodman('container runs on rootless Podman (its Docker-compatible socket)', () => {
  let llm: FakeLlm
  let home: TestHome
  let serve: (ServeProcess & {apiKey: string}) | undefined
  /** A server on the host's loopback a network-none run must not reach. */
  let listener: net.Server
  let listenerPort = 0
  let reached = false
  const workspace = (agent: string) => path.join(home.home, 'agents', agent)
  /** What Podman on this machine cannot apply (empty on cgroup v2 with the controllers delegated). */
  let gaps: ReturnType<typeof limitGaps> = []
  let proxy: ResultPromise | undefined
  let sshd: OwnSshd | undefined
  let port = 0
  const certificates = fs.mkdtempSync(path.join(os.tmpdir(), 'meepa-podman-tls-'))

  beforeAll(async () => {
    await ensurePodmanBaseImage()
    listener = net.createServer((socket) => {
      reached = true
      socket.destroy()
    })
    await new Promise<void>((resolve) => listener.listen(0, '127.0.0.1', resolve))
    listenerPort = (listener.address() as net.AddressInfo).port
    llm = await startFakeLlm()
    llm.setDefault(shellScripted)
    port = await freePort()
    const engine = {host: PODMAN_HOST, kind: 'podman', max_runs: 4}
    const {server, client} = makeCertificates(certificates)
    const proxyPort = await freePort()
    proxy = execa('socat', [
      `openssl-listen:${proxyPort},bind=127.0.0.1,reuseaddr,fork,cert=${server.cert},key=${server.key},cafile=${server.ca},verify=1`,
      `unix-connect:${PODMAN_HOST.slice('unix://'.length)}`,
    ])
    proxy.catch(() => {})
    // the far side's docker reaches nothing: only `podman system dial-stdio` gets there
    sshd = await startOwnSshd({dockerHost: 'unix:///nonexistent/docker.sock', containerHost: PODMAN_HOST})
    gaps = limitGaps(await probedPodmanHost({name: 'podman', insecure: false, best_effort: false, ...engine} as never))
    const agent = (id: string, engines: string[]) => ({
      id,
      limits: {disk: '8m'},
      container_mode: {
        enabled: true,
        network: 'none',
        memory_limit: '512m',
        pids_limit: 64,
        timeout_seconds: 120,
        engines,
      },
    })
    home = makeHome(
      fakeLlmConfig(
        llm.openaiBaseUrl,
        [agent('pod', ['podman']), agent('strict', ['strict']), agent('farpod', ['far']), agent('sshpod', ['viassh'])],
        {
          captain: {enabled: true, bind: '127.0.0.1', port},
          engines: [
            {name: 'podman', ...engine, best_effort: true},
            {name: 'strict', ...engine},
            {
              name: 'far',
              host: `tcp://127.0.0.1:${proxyPort}`,
              tls: {ca: client.ca, cert: client.cert, key: client.key},
              kind: 'podman',
              best_effort: true,
            },
            {
              name: 'viassh',
              host: sshd.host,
              ssh: {known_hosts: sshd.knownHosts, identity: sshd.identity},
              kind: 'podman',
              best_effort: true,
            },
            {
              name: 'podwrong',
              host: sshd.host,
              ssh: {known_hosts: sshd.wrongHosts, identity: sshd.identity},
              kind: 'podman',
              best_effort: true,
            },
          ],
        },
      ),
    )
    serve = await startServe({home: home.home, port})
    // the first message builds the isolation image in the Podman user's storage
    const first = await serve.chat('pod', 'hello')
    expect(first.reply, serve.output().slice(-3000)).toBe('pong')
  }, 1_200_000)

  afterAll(async () => {
    if (serve && serve.process.exitCode === null) await serve.stop()
    await llm?.close()
    listener?.close()
    proxy?.kill()
    sshd?.destroy()
    fs.rmSync(certificates, {recursive: true, force: true})
    if (home) {
      // this home's containers and workspace volumes on the Podman engine
      const label = homeLabel(home.home)
      const left = (await podmanDocker(['ps', '-aq', '--filter', `label=meepagateway.home=${label}`])).stdout
      if (left.trim()) await podmanDocker(['rm', '-f', ...left.trim().split('\n')])
      const volumes = ['pod', 'farpod', 'strict', 'sshpod'].map(
        (agent) => syncedVolume(home.home, 'podman', label, agent).volume,
      )
      await podmanDocker(['volume', 'rm', '-f', ...volumes])
    }
    home?.cleanup()
  }, 120_000)

  it('runs a message there: a tool call writes to the workspace, the reply arrives, the write is on the host', async () => {
    fs.writeFileSync(path.join(workspace('pod'), 'seed.txt'), 'from-the-host')
    const wrote = await serve!.chat('pod', 'RUN: cat seed.txt && echo made-in-podman > note.txt && ls -ln note.txt')
    expect(wrote.reply, serve!.output().slice(-3000)).toContain('from-the-host')
    expect(serve!.output()).toMatch(/running on engine podman/)
    expect(fs.readFileSync(path.join(workspace('pod'), 'note.txt'), 'utf8')).toBe('made-in-podman\n')
    // inside the user namespace the file is the run user's (never root's, never an unmapped id)
    expect(wrote.reply).toMatch(/-rw-r--r-- 1 65532 65532 .* note\.txt/)
    // message N+1 sees message N's write
    expect((await serve!.chat('pod', 'RUN: cat note.txt')).reply).toContain('made-in-podman')
  }, 180_000)

  it('a volume the engine lost (a prune, a reset) never empties the host workspace: the run gets it whole', async () => {
    fs.writeFileSync(path.join(workspace('pod'), 'kept.txt'), 'on-the-host')
    expect((await serve!.chat('pod', 'RUN: cat kept.txt')).reply).toContain('on-the-host')
    const before = fs.readdirSync(workspace('pod')).sort()
    const memory = fs.statSync(path.join(workspace('pod'), 'memory.db')).size
    // the engine drops the volume, and a standby on it: the next run there gets an empty one of that name
    const volume = syncedVolume(home.home, 'podman', homeLabel(home.home), 'pod').volume
    // `podman volume rm -f` through Podman's own API: the containers on it go too
    const removed = await execa('curl', [
      '-sS',
      '-o',
      '/dev/null',
      '-w',
      '%{http_code}',
      '-X',
      'DELETE',
      '--unix-socket',
      PODMAN_HOST.slice('unix://'.length),
      `http://d/v4.0.0/libpod/volumes/${volume}?force=true`,
    ])
    expect(removed.stdout).toBe('204')
    const reply = await serve!.chat('pod', 'RUN: cat kept.txt note.txt && ls -A')
    expect(reply.reply, serve!.output().slice(-3000)).toContain('on-the-hostmade-in-podman')
    // found lost by the run; or, when the standby was still being made as the volume went, by Podman
    // refusing that standby, whose message then has a fresh container on a volume filled whole
    expect(serve!.output()).toMatch(
      /the engine lost or replaced the volume, or a run removed it\)+; attaching it again|standby container \S+ never started: .*no such volume.*; starting a fresh container/,
    )
    // nothing the host had is gone, and its memory is the same one, grown
    expect(fs.readdirSync(workspace('pod')).sort()).toEqual(expect.arrayContaining(before))
    expect(fs.readFileSync(path.join(workspace('pod'), 'kept.txt'), 'utf8')).toBe('on-the-host')
    expect(fs.statSync(path.join(workspace('pod'), 'memory.db')).size).toBeGreaterThanOrEqual(memory)
    expect((await serve!.chat('pod', 'RUN: cat note.txt')).reply).toContain('made-in-podman')
  }, 180_000)

  /** The host's file reaches the run on `engine`, and the run's write comes back to the host. */
  const expectRoundTrip = async (agent: string, engine: string) => {
    // the first message makes the workspace
    expect((await serve!.chat(agent, 'hello')).reply, serve!.output().slice(-3000)).toBe('pong')
    fs.writeFileSync(path.join(workspace(agent), 'seed.txt'), `sent-to-${engine}`)
    const wrote = await serve!.chat(agent, `RUN: cat seed.txt && echo made-on-${engine} > made.txt`)
    expect(wrote.reply, serve!.output().slice(-3000)).toContain(`sent-to-${engine}`)
    expect(serve!.output()).toMatch(new RegExp(`running on engine ${engine}\\b`))
    expect(fs.readFileSync(path.join(workspace(agent), 'made.txt'), 'utf8')).toBe(`made-on-${engine}\n`)
  }

  it('runs a message on the same Podman reached as a remote engine (tcp:// with mutual TLS)', async () => {
    await expectRoundTrip('farpod', 'far')
  }, 180_000)

  it('runs a message on the same Podman reached over ssh:// (podman system dial-stdio there), host keys checked', async () => {
    await expectRoundTrip('sshpod', 'viassh')
    // its own API answers over the same ssh: the watch counts it up; a host key it does not know is refused
    await waitFor('the engine with the wrong host key marked down', () => healthzNamesDown(serve!, 'podwrong'), 30_000)
    expect(await healthzNamesDown(serve!, 'viassh')).toBe(false)
    const reasons = ((await serve!.healthz()).body.reasons ?? []) as string[]
    expect(reasons.find((reason) => reason.startsWith('engine podwrong down'))).toMatch(/Host key verification failed/)
    // the dashboard names each Podman engine's version, asked on its socket, over TLS and over ssh
    const admin = JSON.parse(
      (await runCli(['api-key', 'create', 'dash', '--admin', '--json'], {home: home.home})).stdout,
    ) as {key: string}
    const podmanVersion = (await podmanDocker(['version', '--format', '{{.Server.Version}}'])).stdout.trim()
    const listed = await waitFor(
      'a version for every Podman engine that answers',
      async () => {
        const response = await fetch(`http://127.0.0.1:${port}/api/captain/engines`, {
          headers: {authorization: `Bearer ${admin.key}`},
        })
        const engines = (await response.json()) as Array<{name: string; health: string; version?: string}>
        return engines.filter((entry) => entry.health === 'up').every((entry) => entry.version) && engines
      },
      30_000,
    )
    for (const name of ['podman', 'far', 'viassh'])
      expect(listed.find((entry) => entry.name === name)).toMatchObject({
        health: 'up',
        version: `Podman ${podmanVersion}`,
      })
    // config check takes it, and reads what it can limit over ssh as over its socket
    const check = await runCli(['config', 'check'], {home: home.home})
    expect(check.exitCode, check.stderr).toBe(0)
    if (gaps.length > 0) expect(check.stderr).toMatch(/engine viassh: cannot apply .*best_effort: true/)
  }, 180_000)

  /**
   * A run writing three files each under the per-file cap (8m), 18 MB together: stopped with E_DISK,
   * nothing of it on the host. `ending` runs after the writes (a sleep: the watch sees it first).
   */
  const expectStoppedPastLimit = async (agent: string, ending = 'sleep 10') => {
    const reply = await serve!.chat(
      agent,
      `RUN: for i in 1 2 3; do dd if=/dev/zero of=fill-$i bs=1M count=6 2>/dev/null; done; ${ending}; echo finished`,
    )
    expect(reply.reply, serve!.output().slice(-2000)).toMatch(/workspace is full/)
    expect(reply.reply).not.toContain('finished')
    expect(fs.readdirSync(workspace(agent)).filter((name) => name.startsWith('fill-'))).toEqual([])
  }

  it("measures limits.disk in the engine's volume on this machine: a run writing past it is stopped with E_DISK", async () => {
    await expectStoppedPastLimit('pod')
    // the next run there starts from the host's copy, without it
    const next = await serve!.chat('pod', 'RUN: ls && echo listed')
    expect(next.reply).toContain('listed')
    expect(next.reply).not.toContain('fill-')
  }, 180_000)

  it('measures limits.disk on a Podman engine elsewhere from a container beside the run: a run writing past it is stopped', async () => {
    await expectStoppedPastLimit('farpod')
    // the measuring container goes with the run
    await waitFor(
      'no measuring container left on the engine',
      async () =>
        (await podmanDocker(['ps', '-aq', '--filter', 'label=meepagateway.run=disk-measure'])).stdout.trim() === '',
      30_000,
    )
    // one that ends at once, before the watch's next reading: its changes, cut at the limit, say it
    await expectStoppedPastLimit('farpod', 'true')
    // a run within the limit is not stopped by it
    expect((await serve!.chat('farpod', 'RUN: echo small > small.txt && echo fine')).reply).toContain('fine')
    expect(fs.readFileSync(path.join(workspace('farpod'), 'small.txt'), 'utf8')).toBe('small\n')
  }, 180_000)

  it('hardening holds inside: read-only root, no capabilities, no new privileges, non-root, no network, file size, init', async () => {
    const script = [
      'id -u',
      'grep -E "^(CapEff|CapBnd|NoNewPrivs)" /proc/self/status',
      'touch /usr/x 2>&1 || echo ROOT-READONLY',
      'touch /tmp/t && echo TMP-WRITABLE',
      // the file size limit: a write past it fails
      `head -c ${FILE_SIZE_LIMIT + 4096} /dev/zero > big 2>&1; echo big=$(stat -c %s big)`,
      'rm -f big',
      'grep "Max file size" /proc/self/limits',
      'cat /proc/net/dev | tail -n +3 | cut -d: -f1 | tr -d " "',
      `(exec 3<>/dev/tcp/127.0.0.1/${listenerPort}) 2>/dev/null && echo REACHED || echo NO-NETWORK`,
      'tr "\\0" " " < /proc/1/cmdline; echo',
      // allow_listen is off: the sandbox helper's layer refuses a listening socket
      `/opt/meepagateway/bin/node -e "require('net').createServer().listen(0, '127.0.0.1', () => console.log('LISTENING')).on('error', (e) => console.log('LISTEN-DENIED', e.code))"`,
    ].join('; ')
    const running = serve!.chat('pod', `RUN: bash -c '${script.replaceAll("'", "'\\''")}'; sleep 2`)
    // the running container, as the engine holds it
    const inspected = await waitFor(
      'the run container on the Podman engine',
      async () => {
        const ids = (await podmanDocker(['ps', '-q', '--filter', 'label=meepagateway.agent=pod'])).stdout.trim()
        if (!ids) return undefined
        const raw = (await podmanDocker(['inspect', ...ids.split('\n')])).stdout
        return raw.includes('"Running": true') || raw.includes('"Running":true') ? raw : undefined
      },
      60_000,
    )
    const [container] = JSON.parse(inspected) as Array<{
      HostConfig: {ReadonlyRootfs: boolean; CapAdd: string[] | null; SecurityOpt: string[]; NetworkMode: string}
      Config: {User: string; Env: string[]; Cmd: string[]; Entrypoint: string | string[]}
    }>
    expect(container!.HostConfig.ReadonlyRootfs).toBe(true)
    expect(container!.HostConfig.CapAdd ?? []).toEqual([])
    expect(container!.HostConfig.SecurityOpt).toContain('no-new-privileges')
    expect(container!.HostConfig.NetworkMode).toBe('none')
    expect(container!.Config.User).toBe('65532:65532')
    // no provider key in the container's environment or argv
    expect(inspected).not.toContain(KEY)
    const reply = (await running).reply
    expect(reply, serve!.output().slice(-2000)).toMatch(/^65532$/m)
    expect(reply).toMatch(/CapEff:\s+0000000000000000/)
    expect(reply).toMatch(/CapBnd:\s+0000000000000000/)
    expect(reply).toMatch(/NoNewPrivs:\s+1/)
    expect(reply).toContain('ROOT-READONLY')
    expect(reply).toContain('TMP-WRITABLE')
    expect(reply).toMatch(/File size limit exceeded|File too large/)
    expect(Number(/big=(\d+)/.exec(reply)?.[1])).toBeLessThanOrEqual(FILE_SIZE_LIMIT)
    expect(reply).toMatch(
      new RegExp(
        `Max file size\\s+${FILE_SIZE_LIMIT - (FILE_SIZE_LIMIT % 512)}\\s+${FILE_SIZE_LIMIT - (FILE_SIZE_LIMIT % 512)}`,
      ),
    )
    // only loopback, and it is the container's own
    expect(reply).toMatch(/^lo$/m)
    expect(reply).not.toMatch(/^(eth|tap|en)\w*$/m)
    expect(reply).toContain('NO-NETWORK')
    expect(reached).toBe(false)
    // --init: an init is pid 1, agent-run is not
    expect(reply).toMatch(/podman-init|catatonit|tini/)
    expect(reply).toMatch(/LISTEN-DENIED/)
    expect(reply).not.toMatch(/^LISTENING$/m)
    expect(reply).not.toContain(KEY)
  }, 180_000)

  it('refuses a run the engine cannot limit, naming the limit and why; best_effort runs and says so', async () => {
    if (gaps.length === 0) {
      // this engine applies every limit: nothing to refuse here (cgroup v2 with delegated controllers)
      expect((await serve!.chat('strict', 'hello')).reply).toBe('pong')
      return
    }
    const refused = await serve!.chat('strict', 'RUN: echo should-not-run > ran.txt')
    expect(refused.reply).toMatch(/^Sorry, .* The operator has the details/)
    // the operator is told which limits and why
    expect(serve!.output()).toMatch(
      new RegExp(
        `engine strict \\(Podman\\) cannot apply ${gaps.map((gap) => gap.limit).join(', ')}, so the run was refused \\(best_effort: true on the engine would run without them\\): container_mode\\.`,
      ),
    )
    expect(fs.existsSync(path.join(workspace('strict'), 'ran.txt'))).toBe(false)
    // the best_effort engine ran its runs, each one saying which limits it went without
    expect(serve!.output()).toMatch(
      new RegExp(`best effort: engine podman runs this message WITHOUT ${gaps.map((gap) => gap.limit).join(', ')}`),
    )
    // config check and container status name the limit and why
    const check = await runCli(['config', 'check'], {home: home.home})
    expect(check.exitCode, check.stderr).toBe(0)
    expect(check.stderr).toMatch(
      /engine strict: cannot apply container_mode\.memory_limit \(memory\): .*runs are refused/,
    )
    expect(check.stderr).toMatch(/engine podman: cannot apply .*best_effort: true/)
    const status = await runCli(['container', 'status'], {home: home.home})
    expect(status.stdout + status.stderr).toMatch(/engine strict: cannot apply container_mode\.pids_limit \(pids\)/)
  }, 180_000)
})
