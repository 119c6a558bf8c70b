import {execa} from 'execa'
import fs from 'node:fs'
import os from 'node:os'
import path from 'node:path'
import {afterAll, beforeAll, expect, it} from 'vitest'
import {startFakeLlm, type FakeLlm} from '../../../fakes/llm-server.js'
import {shellScripted} from '../../../helpers/fake-llm-for-tests.js'
import {waitFor} from '../../../helpers/wait-for.js'
import {freePort} from '../../../helpers/free-port.js'
import {fakeLlmConfig, makeHome, type TestHome} from '../../../helpers/home.js'
import {startServe, type ServeProcess} from '../../../helpers/serve.js'
import {BASE_IMAGE, describeWithDocker} from '../../../helpers/docker-env.js'
import {startOwnEngine, type OwnEngine} from '../../../helpers/own-engine.js'
import {expectNoKeyOnEngine, healthzNamesDown, inAgentVolume, lastEngineOf} from '../../../helpers/engine-scan.js'
import {DockerCli} from '../../../../src/sandbox/docker/cli.js'
import {engineArgsOf} from '../../../../src/runtime/runners/container/engines.js'
import {engineDisksVolume} from '../../../../src/runtime/container/engine-state.js'
import {homeLabel} from '../../../../src/sandbox/docker/home-label.js'
import {toGatewayError} from '../../../../src/runtime/util/errors.js'

/*
 * A second dockerd of the test's own, reached over tcp://127.0.0.1 with mutual TLS (certificates
 * made with openssl here), as the `remote` engine of a gateway served by bin/run.js. It could bind
 * host paths (it is on this machine), but the runner must never ask it to: files reach the host
 * only through the workspace sync.
 */

describeWithDocker('container runs on a remote engine over mutual TLS (own engine)', () => {
  let engine: OwnEngine
  let llm: FakeLlm
  let home: TestHome
  let serve: (ServeProcess & {apiKey: string}) | undefined
  const workspace = (agent: string) => path.join(home.home, 'agents', agent)
  /** The remote dockerd is SIGSTOPped (a failed test must not leave it so for destroy). */
  let stopped = false
  const outside = fs.mkdtempSync(path.join(os.tmpdir(), 'meepa-outside-'))

  const degradedNaming = (name: string) => healthzNamesDown(serve!, name)
  const lastEngine = () => lastEngineOf(serve!)
  const inVolume = (agent: string, command: string, ...args: string[]) => inAgentVolume(engine, agent, command, ...args)
  /** The standby containers of an agent waiting on the remote engine, as its own `docker ps` lists them: "ID NAME". */
  const remoteStandbys = async (agent: string): Promise<string[]> =>
    (
      await engine.docker([
        'ps',
        '--format',
        '{{.ID}} {{.Names}}',
        '--filter',
        `label=meepagateway.agent=${agent}`,
        '--filter',
        'label=meepagateway.run=standby',
      ])
    ).stdout
      .split('\n')
      .filter(Boolean)
  /**
   * The one standby of an agent waiting on the remote engine, once it is there: its container id
   * and name. The standby that ran the last message may still be up, waiting for the host to take
   * its changes; it is not waiting for a message, so it is left out.
   */
  const remoteStandby = async (agent: string) => {
    const ranMessages = new Set([...serve!.output().matchAll(/running in standby container (\S+),/g)].map((m) => m[1]))
    const [line] = await waitFor(
      `a standby of ${agent} on the remote engine`,
      async () => {
        const found = await remoteStandbys(agent)
        return found.length === 1 && !ranMessages.has(found[0]!.split(' ')[1]) && found
      },
      30_000,
    )
    const [id = '', name = ''] = line!.split(' ')
    return {id, name}
  }
  /** The agent's workspace volume on the remote engine. */
  const volumeName = async (agent: string) =>
    (await engine.docker(['volume', 'ls', '-q'])).stdout.split('\n').find((name) => name.endsWith(`-${agent}`))!
  /** What the agent's volume on the remote engine holds. */
  const volumeFiles = async (agent: string) =>
    (await inVolume(agent, 'ls', '-A', '/w')).stdout.split('\n').filter(Boolean)

  beforeAll(async () => {
    engine = await startOwnEngine({tls: true, port: await freePort()})
    llm = await startFakeLlm()
    llm.setDefault(shellScripted)
    const port = await freePort()
    const tls = engine.tls!
    const agent = (id: string, engines?: string[]) => ({
      id,
      container_mode: {
        enabled: true,
        network: 'none',
        memory_limit: '512m',
        timeout_seconds: 60,
        ...(engines ? {engines} : {}),
      },
    })
    // limits.disk of 8m: on the remote engine, an ext4 image of that size (engine-disk.ts)
    const small = {...agent('small', ['remote']), limits: {disk: '8m'}}
    home = makeHome(
      fakeLlmConfig(llm.openaiBaseUrl, [agent('far', ['remote']), agent('any'), small], {
        captain: {enabled: true, bind: '127.0.0.1', port},
        engines: [
          {name: 'remote', host: tls.host, tls: {ca: tls.ca, cert: tls.cert, key: tls.key}, max_runs: 4},
          {name: 'local', host: process.env.DOCKER_HOST || 'unix:///var/run/docker.sock'},
        ],
      }),
    )
    serve = await startServe({home: home.home, port})
    // the first message builds the isolation image on the remote engine
    const first = await serve.chat('far', 'hello')
    expect(first.reply, serve.output().slice(-3000)).toBe('pong')
  }, 900_000)

  afterAll(async () => {
    if (stopped) engine.resume()
    if (serve && serve.process.exitCode === null) await serve.stop()
    await engine?.destroy()
    await llm?.close()
    home?.cleanup()
    fs.rmSync(outside, {recursive: true, force: true})
  }, 120_000)

  it('runs a message there: it sees the host workspace, and what it writes comes back through the sync', async () => {
    fs.writeFileSync(path.join(workspace('far'), 'seed.txt'), 'from-the-host')
    const wrote = await serve!.chat(
      'far',
      'RUN: cat seed.txt && echo made-remotely > note.txt && mkdir -p d/e && echo deep > d/e/f',
    )
    expect(wrote.reply).toContain('from-the-host')
    expect(lastEngine()).toBe('remote')
    expect(fs.readFileSync(path.join(workspace('far'), 'note.txt'), 'utf8')).toBe('made-remotely\n')
    expect(fs.readFileSync(path.join(workspace('far'), 'd/e/f'), 'utf8')).toBe('deep\n')
    // the run's workspace was the engine-side volume, not a bind of the host path
    expect(await volumeFiles('far')).toEqual(expect.arrayContaining(['seed.txt', 'note.txt', 'd']))
    // message N+1 sees message N's writes; a file removed there is removed on the host
    const next = await serve!.chat('far', 'RUN: cat note.txt && rm note.txt')
    expect(next.reply).toContain('made-remotely')
    expect(fs.existsSync(path.join(workspace('far'), 'note.txt'))).toBe(false)
    // an edit on the host (as the dashboard makes) reaches the next run
    fs.writeFileSync(path.join(workspace('far'), 'seed.txt'), 'edited-on-the-host')
    expect((await serve!.chat('far', 'RUN: cat seed.txt')).reply).toContain('edited-on-the-host')
  }, 120_000)

  it('runs the next message in a standby container waiting on that engine, on the volume as the host has it then', async () => {
    await serve!.chat('far', 'RUN: echo message-n > n.txt')
    // the standby that stays: one made a moment earlier may still be giving way to it
    const {id, name} = await waitFor(
      'one standby of far on the remote engine, the same for a second',
      async () => {
        const seen = await remoteStandby('far')
        await new Promise((resolve) => setTimeout(resolve, 1000))
        const now = await remoteStandbys('far')
        return now.length === 1 && now[0] === `${seen.id} ${seen.name}` && seen
      },
      60_000,
    )
    // the local engine holds none of it
    const local = await execa('docker', ['ps', '-q', '--filter', 'label=meepagateway.agent=far'])
    expect(local.stdout.trim()).toBe('')
    // the host changes after the standby started, as a run on another engine or the dashboard does
    const late = path.join(workspace('far'), 'late.txt')
    fs.writeFileSync(late, 'written-after-the-standby-started')
    const lateInode = fs.statSync(late).ino
    const before = serve!.output().length
    const reply = await serve!.chat('far', 'RUN: hostname && cat n.txt late.txt')
    const log = serve!.output().slice(before)
    expect(log).toContain(`running in standby container ${name}`)
    expect(reply.reply).toContain(id) // its hostname: that very container ran the message
    expect(reply.reply).toContain('message-n')
    expect(reply.reply).toContain('written-after-the-standby-started')
    // what was sent as the message came is not the run's change: it is not taken back (rewritten) again
    expect(fs.statSync(late).ino).toBe(lateInode)
  }, 120_000)

  it('what the host changes while a run is under way reaches the next run, and the run never removes it', async () => {
    const far = (name: string) => path.join(workspace('far'), name)
    fs.writeFileSync(far('edited-during.txt'), 'first')
    fs.mkdirSync(far('old-folder'))
    fs.writeFileSync(far('old-folder/was.txt'), 'was')
    expect((await serve!.chat('far', 'RUN: cat edited-during.txt')).reply).toContain('first')
    const asked = llm.requests.length
    // the run removes a folder and makes a file of that name
    const running = serve!.chat('far', 'RUN: sleep 2; rm -rf old-folder; echo a-file > old-folder; echo slept')
    await waitFor('the run asking for its command', async () => llm.requests.length > asked, 30_000)
    // the operator, during the run: an edit, and a new file in the folder the run removes
    fs.writeFileSync(far('edited-during.txt'), 'second-from-the-operator')
    fs.writeFileSync(far('old-folder/added-during.txt'), 'added')
    expect((await running).reply).toContain('slept')
    // the host keeps the new file (its folder with it); the run's removal of the rest stands, and
    // the next push makes the volume's file that folder again
    expect(fs.readdirSync(far('old-folder'))).toEqual(['added-during.txt'])
    const next = await serve!.chat('far', 'RUN: cat edited-during.txt old-folder/added-during.txt; ls old-folder')
    expect(next.reply, serve!.output().slice(-2000)).toContain('second-from-the-operator')
    expect(next.reply).toContain('added')
    expect(next.reply).not.toContain('was.txt')
  }, 120_000)

  it("makes the agent's links as links (never followed), never its FIFOs or escapes, and never writes through a planted link", async () => {
    const far = (name: string) => path.join(workspace('far'), name)
    fs.symlinkSync(outside, far('planted'))
    fs.symlinkSync('seed.txt', far('host-link'))
    const reply = await serve!.chat(
      'far',
      'RUN: readlink host-link; ln -s /etc/passwd link; ln -s d/e latest; mkfifo fifo; ' +
        'rm -f planted; mkdir -p planted && echo pwned > planted/x; echo fine > plain; echo ok',
    )
    expect(reply.reply, serve!.output().slice(-2000)).toContain('ok')
    // the host's link reached the run as a link
    expect(reply.reply).toMatch(/^seed\.txt$/m)
    expect(fs.readFileSync(far('plain'), 'utf8')).toBe('fine\n')
    expect(fs.readlinkSync(far('link'))).toBe('/etc/passwd')
    expect(fs.readlinkSync(far('latest'))).toBe('d/e')
    expect(fs.existsSync(far('fifo'))).toBe(false)
    expect(fs.existsSync(path.join(outside, 'x'))).toBe(false)
    expect(fs.lstatSync(far('planted')).isSymbolicLink()).toBe(true)
    // a link the host removes is gone from the next run; the others are still links there
    fs.rmSync(far('latest'))
    const next = await serve!.chat('far', 'RUN: ls -l && echo listed')
    expect(next.reply).toContain('listed')
    expect(next.reply).not.toMatch(/latest ->/)
    expect(next.reply).toMatch(/link -> \/etc\/passwd/)
  }, 120_000)

  it('brings back names of up to 255 bytes; a change the host cannot write fails the message, and the next run starts from the host’s workspace', async () => {
    const far = (name: string) => path.join(workspace('far'), name)
    const long = `${'n'.repeat(246)}.txt`
    const link = 'l'.repeat(255)
    const made = await serve!.chat('far', `RUN: echo long > ${long} && ln -s ${long} ${link} && echo made`)
    expect(made.reply, serve!.output().slice(-2000)).toContain('made')
    expect(fs.readFileSync(far(long), 'utf8')).toBe('long\n')
    expect(fs.readlinkSync(far(link))).toBe(long)
    // the host's disk is full where the run writes: a filesystem of 64 KiB over a folder of the workspace
    fs.mkdirSync(far('full'))
    await execa('mount', ['-t', 'tmpfs', '-o', 'size=64k', 'meepa-test-full', far('full')])
    const before = serve!.output().length
    let failed: {reply: string}
    try {
      failed = await serve!.chat('far', 'RUN: head -c 1048576 /dev/zero > full/big && echo wrote')
    } finally {
      await execa('umount', ['-l', far('full')])
    }
    // never reported done: the user is told it went wrong, the operator which file and why
    expect(failed.reply).not.toContain('wrote')
    expect(failed.reply).toMatch(/something went wrong/)
    expect(serve!.output().slice(before)).toMatch(
      /E_WORKSPACE .*could not be brought back: "full\/big" could not be written on the host: the host's disk is full \(ENOSPC\)/,
    )
    // the next run trusts no record of the volume: it sees the host's workspace, without the file
    const next = await serve!.chat('far', `RUN: ls -A full; cat ${long}; echo listed`)
    expect(next.reply, serve!.output().slice(-2000)).toContain('listed')
    expect(next.reply).toContain('long')
    expect(next.reply).not.toContain('big')
  }, 120_000)

  it('takes back every write of the run even when the agent moves its start marks, and nothing it left running writes after', async () => {
    const reply = await serve!.chat(
      'far',
      // a writer left behind, then both marks an earlier design read moved an hour ahead
      'RUN: (sleep 2; echo late > left-running.txt) > /dev/null 2>&1 & ' +
        'echo hidden > hidden.txt; touch -d "+1 hour" .meepa-sync/mark; ' +
        'echo "$(( $(date +%s) + 3600 ))000000000 forged" > /tmp/.meepa-start; echo done',
    )
    expect(reply.reply).toContain('done')
    expect(fs.readFileSync(path.join(workspace('far'), 'hidden.txt'), 'utf8')).toBe('hidden\n')
    await new Promise((resolve) => setTimeout(resolve, 3000))
    // the writer was stopped before the listing: the volume holds no file the host lacks
    const next = await serve!.chat('far', 'RUN: ls && echo listed')
    expect(next.reply).toContain('listed')
    expect(next.reply).not.toContain('left-running.txt')
    expect(fs.existsSync(path.join(workspace('far'), 'left-running.txt'))).toBe(false)
  }, 120_000)

  it('sends no provider key to the remote engine: not in the container, its environment, argv or volume', async () => {
    const key = 'sk-fake-test-key-123456' // what startServe gives FAKE_LLM_KEY
    await expectNoKeyOnEngine(serve!, engine, 'far', key)
  }, 120_000)

  it('refuses an engine whose certificate the CA did not sign, saying so', async () => {
    const tls = engine.tls!
    const cli = new DockerCli({
      engineArgs: engineArgsOf({
        name: 'x',
        host: tls.host,
        kind: 'docker',
        max_runs: 1,
        insecure: false,
        tls: {...tls, ca: tls.otherCa},
      }),
    })
    const error = await cli.ping({timeoutMs: 10_000}).then(
      () => undefined,
      (caught: unknown) => toGatewayError(caught),
    )
    expect(error?.message).toMatch(/TLS handshake failed.*certificate/)
    expect(error?.suggestions.join(' ')).toContain('engines[].tls.ca')
    // and with the right CA it answers
    await new DockerCli({
      engineArgs: engineArgsOf({name: 'x', host: tls.host, kind: 'docker', max_runs: 1, insecure: false, tls}),
    }).ping({timeoutMs: 10_000})
  }, 60_000)

  /** What the gateway recorded of an agent's disk image on the remote engine. */
  const diskOf = (agent: string) =>
    JSON.parse(
      fs.readFileSync(path.join(home.home, 'cache', 'engine-sync', 'remote', `${agent}.disk.json`), 'utf8'),
    ) as {
      device: string
      image: string
    }
  /** A root shell on the engine's host that may attach and detach loop devices (as a reboot would). */
  const onEngineHost = (script: string) =>
    engine.docker([
      'run',
      '--rm',
      '--cap-add=SYS_ADMIN',
      '--device-cgroup-rule',
      'b 7:* rwm',
      '--device-cgroup-rule',
      'c 10:237 rwm',
      '-v',
      '/dev:/dev',
      '-v',
      'meepa-test-impostor:/impostor',
      '--entrypoint',
      '/bin/sh',
      BASE_IMAGE,
      '-c',
      `{ ${script}; } 2>&1`,
    ])
  /** The agent's containers on the engine removed, as a host restart would (the volume is then mounted by none). */
  const removeAgentContainers = async (agent: string) => {
    await remoteStandby(agent) // the one the last run started: none comes after it

    const ids = (await engine.docker(['ps', '-aq', '--filter', `label=meepagateway.agent=${agent}`])).stdout
    if (ids.trim()) await engine.docker(['rm', '-f', ...ids.trim().split('\n')])
  }

  it("holds limits.disk on the engine: the agent's volume there is a filesystem of that size, and a write past it fails", async () => {
    const reply = await serve!.chat(
      'small',
      'RUN: echo kept > keep.txt; mkdir -p a/b/c; dd if=/dev/zero of=a/b/c/big bs=1M count=20 2>&1 | head -n 2; echo wrote',
    )
    expect(reply.reply, serve!.output().slice(-2000)).toContain('No space left on device')
    expect(serve!.output()).toMatch(/limits\.disk: agent small's volume on engine remote is its \d+-byte filesystem/)
    // the engine's own view: the volume is ext4 of at most 8 MiB, and holds no more
    const df = await inVolume('small', 'df', '-k', '--output=fstype,size,used', '/w')
    const [, sizeK = '0', usedK = '0'] = df.stdout.split('\n')[1]!.trim().split(/\s+/)
    expect(Number(sizeK)).toBeLessThanOrEqual(8 * 1024)
    expect(Number(usedK)).toBeLessThanOrEqual(8 * 1024)
    const options = (
      await engine.docker(['volume', 'inspect', '--format', '{{json .Options}}', `${await volumeName('small')}`])
    ).stdout
    // no barriers: the volume is a copy the host forgets whenever its image is attached anew
    expect(JSON.parse(options)).toMatchObject({
      type: 'ext4',
      device: diskOf('small').device,
      o: 'nosuid,nodev,noatime,nobarrier',
    })
    // the next message still runs there and sees the first one's files
    expect((await serve!.chat('small', 'RUN: cat keep.txt')).reply).toContain('kept')
  }, 180_000)

  /**
   * A reboot leaves nothing mounted. The engine may hold a volume's mount a while after its last
   * container went (it counts the volume's users), so the device is unmounted here (the engine's host).
   */
  const unmountAsRebooted = async (device: string) => {
    for (const line of fs.readFileSync('/proc/self/mountinfo', 'utf8').split('\n'))
      if (line.split(' - ')[1]?.split(' ')[1] === device)
        await execa('umount', ['-l', line.split(' ')[4]!], {reject: false})
  }

  it('a loop device lost with the engine host (gone, or backing another filesystem) is never written: the image is attached anew and the run placed again', async () => {
    await serve!.chat('small', 'RUN: echo before-reboot > mine.txt')
    // the "reboot": the agent's device now backs another filesystem, with a file of its own
    await removeAgentContainers('small')
    const {device} = diskOf('small')
    await unmountAsRebooted(device)
    // The filesystem is made first so the device is free for as short a time as possible: other
    // test files attach loop devices too. A detach while the device is still open only marks it
    // (autoclear), so the attach is tried until the last holder has let go.
    const impostor = await onEngineHost(
      `set -e; fallocate -l 8M /impostor/other.ext4; mkfs.ext4 -q -F /impostor/other.ext4; losetup -d ${device}; ` +
        `for i in $(seq 500); do losetup ${device} /impostor/other.ext4 2>/dev/null && { echo attached; exit 0; }; sleep 0.02; done; ` +
        `losetup -l ${device}`,
    )
    expect(impostor.stdout).toContain('attached')
    const other = ['--opt', 'type=ext4', '--opt', `device=${device}`, 'meepa-test-other']
    await engine.docker(['volume', 'create', ...other])
    await engine.docker([
      'run',
      '--rm',
      '-v',
      'meepa-test-other:/o',
      '--entrypoint',
      '/bin/sh',
      BASE_IMAGE,
      '-c',
      'echo other-agent > /o/theirs.txt',
    ])
    // a change on the host makes the gateway push first: that push must not touch the other filesystem
    fs.writeFileSync(path.join(workspace('small'), 'host-edit.txt'), 'edited')
    const before = serve!.output().length
    const reply = await serve!.chat('small', 'RUN: ls && cat mine.txt host-edit.txt')
    expect(reply.reply, serve!.output().slice(before)).toContain('before-reboot')
    expect(reply.reply).toContain('edited')
    expect(reply.reply).not.toContain('theirs.txt')
    expect(serve!.output().slice(before)).toMatch(/is not this agent's filesystem any more.*placing the run again/)
    expect(diskOf('small').device).not.toBe(device)
    // the other filesystem is as it was: nothing emptied, nothing pushed into it
    const theirs = await engine.docker([
      'run',
      '--rm',
      '-v',
      'meepa-test-other:/o',
      '--entrypoint',
      'ls',
      BASE_IMAGE,
      '-A',
      '/o',
    ])
    expect(theirs.stdout.split('\n').filter(Boolean).sort()).toEqual(['lost+found', 'theirs.txt'])

    // the device simply gone (detached): the engine cannot mount the volume; the run still happens once
    await removeAgentContainers('small')
    const second = diskOf('small').device
    await unmountAsRebooted(second)
    await onEngineHost(`losetup -d ${second}`)
    // and the crash left the image's filesystem past e2fsck's repair (its superblocks zeroed): made anew
    await engine.docker([
      'run',
      '--rm',
      '-v',
      `${engineDisksVolume(homeLabel(home.home))}:/disks`,
      '--entrypoint',
      '/bin/sh',
      BASE_IMAGE,
      '-c',
      `dd if=/dev/zero of=/disks/${diskOf('small').image} bs=1M count=2 conv=notrunc 2>&1`,
    ])
    const after = serve!.output().length
    const again = await serve!.chat('small', 'RUN: cat mine.txt && echo once >> runs.txt && cat runs.txt')
    expect(again.reply, serve!.output().slice(after)).toContain('before-reboot')
    expect(again.reply.match(/once/g)).toHaveLength(1)
    expect(serve!.output().slice(after)).toMatch(/placing the run again/)
    await engine.docker(['volume', 'rm', 'meepa-test-other'])
    await onEngineHost(`losetup -d ${device} || true`)
  }, 240_000)

  for (const fault of ['SIGSTOP', 'SIGKILL'] as const) {
    it(`an engine that stops answering (${fault}) is marked down, runs go to the local engine, and it is used again when back`, async () => {
      expect((await serve!.chat('any', 'hello')).reply).toBe('pong')
      expect(lastEngine()).toBe('remote')
      const standbyName = (await remoteStandby('any')).name
      if (fault === 'SIGSTOP') {
        engine.stop()
        stopped = true
      } else await engine.kill()
      const stoppedAt = Date.now()
      await waitFor('healthz naming the remote engine down', () => degradedNaming('remote'), 20_000)
      expect(Date.now() - stoppedAt).toBeLessThan(8_000)
      // its standbys are dropped with it (none waits anywhere now)
      const health = await serve!.healthz()
      const standbys = health.body.standbys as {by_level: {container?: {count: number}}}
      expect(standbys.by_level.container?.count ?? 0).toBe(0)
      // the local engine builds the image on its first run there
      const elsewhere = await serve!.chat('any', 'RUN: echo on-local > local.txt && echo done')
      expect(elsewhere.reply, serve!.output().slice(-2000)).toContain('done')
      expect(lastEngine()).toBe('local')
      // an agent allowed only the remote engine is told, not run elsewhere
      const refused = await serve!.chat('far', 'hello')
      expect(refused.reply).toMatch(/engine is not answering/)
      expect(serve!.output()).toMatch(/no engine can take the run: remote is down/)
      if (fault === 'SIGSTOP') engine.resume()
      else await engine.restart()
      stopped = false
      await waitFor('healthz no longer naming it', async () => !(await degradedNaming('remote')), 30_000)
      // the dropped standby's container is removed once the engine answers
      await waitFor(
        'the dropped standby container removed from the remote engine',
        async () => (await engine.docker(['ps', '-a', '-q', '--filter', `name=${standbyName}`])).stdout.trim() === '',
        30_000,
      )
      const beforeBack = serve!.output().length
      // back on the remote engine, which sees what the local run wrote
      expect((await serve!.chat('any', 'RUN: cat local.txt')).reply).toContain('on-local')
      expect(lastEngine()).toBe('remote')
      // not run in the dropped standby (the log may still say it was removed, after the engine did it)
      expect(serve!.output().slice(beforeBack)).not.toContain(`running in standby container ${standbyName}`)
    }, 600_000)
  }
})
