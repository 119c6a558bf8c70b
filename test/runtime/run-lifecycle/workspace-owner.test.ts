import {execFileSync} from 'node:child_process'
import {execa} from 'execa'
import fs from 'node:fs'
import os from 'node:os'
import path from 'node:path'
import {afterAll, beforeAll, describe, expect, it} from 'vitest'
import {startFakeLlm, type FakeLlm} from '../../fakes/llm-server.js'
import {fakeLlmConfig, makeHome, runCli, type TestHome} from '../../helpers/home.js'
import {homeLabel} from '../../../src/sandbox/docker/home-label.js'
import {UNPRIVILEGED_CONTAINER_UID} from '../../../src/runtime/runners/container/runner.js'
import {describeWithDocker} from '../../helpers/docker-env.js'
import {requireLandlockOrSkip} from '../../helpers/landlock-support.js'
import {handWorkspaceTo, reclaimWorkspace} from '../../../src/runtime/run-lifecycle/workspace-owner.js'
import {ensureWorkspace} from '../../../src/runtime/workspace/workspace.js'
import {cgroupSupport} from '../../../src/sandbox/run-cgroup.js'
import {writeWorkspaceFile} from '../../../src/runtime/workspace/files.js'

/*
 * A root gateway hands an agent's workspace to uid 65532 for container runs. The same agent later
 * run under the host sandbox is root WITHOUT CAP_DAC_OVERRIDE/CAP_FOWNER: unless the gateway takes the
 * workspace back, every write to what the container made fails with EACCES.
 */
const enabled = requireLandlockOrSkip('workspace owner hand-back tests') && process.getuid?.() === 0
if (process.getuid?.() !== 0)
  process.stderr.write('\n!!! SKIPPING workspace owner hand-back tests: they need a root gateway\n\n')
const C = UNPRIVILEGED_CONTAINER_UID

/** Writes the host-sandbox run attempts: append to a file the container made, create in its directory. */
const HOST_WRITES = [
  'echo host >> made-by-container.txt && echo APPENDED',
  'echo host > container-dir/from-host.txt && echo CREATED',
  'mkdir container-dir/sub && echo MKDIR',
].join('; ')

function expectHostWritesLanded(workspace: string, output: string): void {
  expect(output).toContain('APPENDED')
  expect(output).toContain('CREATED')
  expect(output).toContain('MKDIR')
  expect(output).not.toMatch(/Permission denied|EACCES/)
  expect(fs.readFileSync(path.join(workspace, 'made-by-container.txt'), 'utf8')).toBe('container\nhost\n')
  expect(fs.readFileSync(path.join(workspace, 'container-dir', 'from-host.txt'), 'utf8')).toBe('host\n')
}

describe.skipIf(!enabled)('host sandbox after a container run (root gateway)', () => {
  let llm: FakeLlm
  const homes: TestHome[] = []
  const newHome = (containerMode: boolean) => {
    const home = makeHome(
      fakeLlmConfig(llm.openaiBaseUrl, [
        {id: 'box', container_mode: {enabled: containerMode, network: 'none', timeout_seconds: 60}},
      ]),
    )
    homes.push(home)
    return home
  }
  /** One message whose model runs `command` in the shell tool; returns the tool result. */
  const sendShell = async (home: TestHome, command: string) => {
    llm.reset()
    llm.enqueue({toolCalls: [{name: 'shell', arguments: {command}}]}, {text: 'done'})
    const result = await runCli(['send', '--agent', 'box', 'go'], {home: home.home, timeoutMs: 240_000})
    expect(result.exitCode, result.stderr).toBe(0)
    const messages = llm.requests.at(-1)?.body.messages as Array<{role: string; content: string}>
    return String(messages.findLast((message) => message.role === 'tool')?.content)
  }
  /** What a container run leaves: its files, and the whole workspace, owned by uid 65532. */
  const simulateContainerRun = (workspace: string) => {
    fs.writeFileSync(path.join(workspace, 'made-by-container.txt'), 'container\n', {mode: 0o644})
    fs.mkdirSync(path.join(workspace, 'container-dir'), {mode: 0o755})
    fs.writeFileSync(path.join(workspace, 'setuid-tool'), '#!/bin/sh\n')
    fs.chmodSync(path.join(workspace, 'setuid-tool'), 0o4755)
    execFileSync('chown', ['-R', `${C}:${C}`, workspace])
    fs.chmodSync(path.join(workspace, 'setuid-tool'), 0o4755) // the container's uid may set its own file setuid
  }

  beforeAll(async () => {
    llm = await startFakeLlm()
  })
  afterAll(async () => {
    await llm.close()
    for (const home of homes) home.cleanup()
  })

  it('send: writes into files and directories a container run left to uid 65532; setuid bits and planted symlinks do not carry over', async () => {
    const home = newHome(false)
    await sendShell(home, 'true') // creates the workspace
    const workspace = home.workspace('box')
    simulateContainerRun(workspace)
    // a link the agent planted to a file outside its workspace: the hand-back must not follow it
    const outside = fs.mkdtempSync(path.join(os.tmpdir(), 'meepa-owner-outside-'))
    try {
      fs.writeFileSync(path.join(outside, 'victim'), 'x')
      fs.chownSync(path.join(outside, 'victim'), C, C)
      fs.symlinkSync(path.join(outside, 'victim'), path.join(workspace, 'link'))
      fs.lchownSync(path.join(workspace, 'link'), C, C)

      expectHostWritesLanded(workspace, await sendShell(home, HOST_WRITES))
      expect(fs.statSync(path.join(outside, 'victim')).uid).toBe(C)
      const setuid = fs.statSync(path.join(workspace, 'setuid-tool'))
      expect(setuid.uid).toBe(0)
      expect(setuid.mode & 0o6000).toBe(0)
    } finally {
      fs.rmSync(outside, {recursive: true, force: true})
    }
  })

  it('sandbox exec: writes into what a container run left to uid 65532', async () => {
    const home = newHome(false)
    await sendShell(home, 'true')
    const workspace = home.workspace('box')
    simulateContainerRun(workspace)
    const result = await runCli(['sandbox', 'exec', '--agent', 'box', '--', '/bin/sh', '-c', HOST_WRITES], {
      home: home.home,
    })
    expect(result.exitCode, result.stderr).toBe(0)
    expectHostWritesLanded(workspace, result.stdout)
  })

  describeWithDocker('after a real container run (real engine)', () => {
    let home: TestHome
    afterAll(async () => {
      if (!home) return
      const ids = (
        await execa('docker', ['ps', '-a', '-q', '--filter', `label=meepagateway.home=${homeLabel(home.home)}`], {
          reject: false,
        })
      ).stdout
        .split('\n')
        .filter(Boolean)
      if (ids.length > 0) await execa('docker', ['rm', '-f', ...ids], {reject: false})
    })

    it('a container run, then the operator turns container mode off: the host-sandbox run writes what the container made', async () => {
      home = newHome(true)
      // the container's shell commands cannot set a setuid bit at all (the helper's seccomp filter)
      const inside = await sendShell(
        home,
        'id -u; echo container > made-by-container.txt && mkdir container-dir && cp /bin/true setuid-tool && (chmod 4755 setuid-tool || echo REFUSED) && echo MADE',
      )
      expect(inside).toContain(`${C}\n`)
      expect(inside).toContain('MADE')
      expect(inside).toContain('REFUSED')
      expect(inside).toMatch(/chmod: changing permissions of 'setuid-tool': Operation not permitted/)
      // nor change a file outside its grants: the image's files are a read-only root file system
      const outside = await sendShell(
        home,
        'for f in /etc/passwd /usr/bin/env /workspace/../etc/hostname; do chmod 600 $f || echo REFUSED; touch -d 2001-01-01 $f || echo REFUSED; done; stat -c %a /etc/passwd',
      )
      expect(outside.match(/REFUSED/g)).toHaveLength(6)
      expect(outside).toMatch(/Read-only file system/)
      // stdout and stderr reach the tool through two pipes: stat's line need not come last
      expect(outside).toMatch(/^644$/m)
      const workspace = home.workspace('box')
      expect(fs.statSync(path.join(workspace, 'container-dir')).uid).toBe(C)
      expect(fs.statSync(path.join(workspace, 'setuid-tool')).mode & 0o6000).toBe(0)

      home.writeConfig(fakeLlmConfig(llm.openaiBaseUrl, [{id: 'box', container_mode: {enabled: false}}]))
      expectHostWritesLanded(workspace, await sendShell(home, HOST_WRITES))
      expect(fs.statSync(path.join(workspace, 'setuid-tool')).mode & 0o6000).toBe(0)

      // and back to a container: it gets the workspace (the host run's files included) again
      home.writeConfig(
        fakeLlmConfig(llm.openaiBaseUrl, [
          {id: 'box', container_mode: {enabled: true, network: 'none', timeout_seconds: 60}},
        ]),
      )
      const again = await sendShell(home, 'echo container2 >> container-dir/from-host.txt && echo AGAIN')
      expect(again).toContain('AGAIN')
      expect(fs.readFileSync(path.join(workspace, 'container-dir', 'from-host.txt'), 'utf8')).toBe('host\ncontainer2\n')
    }, 300_000)
  })
})

describe.skipIf(process.getuid?.() !== 0)('hand-overs of a root gateway (in process)', () => {
  let home: TestHome
  beforeAll(() => {
    home = makeHome()
  })
  afterAll(() => home.cleanup())
  const handedToContainer = () => {
    const workspace = ensureWorkspace(
      home.home,
      `box${fs.readdirSync(path.join(home.home, 'agents'), {withFileTypes: true}).length}`,
    ).path
    execFileSync('chown', ['-R', `${C}:${C}`, workspace])
    return workspace
  }
  beforeAll(() => fs.mkdirSync(path.join(home.home, 'agents'), {recursive: true}))
  /** 60,000 files in `workspace`/many, on a tmpfs: filling a disk with them takes long on a busy machine. */
  const fillTmpfs = (workspace: string) => {
    const many = path.join(workspace, 'many')
    fs.mkdirSync(many)
    execFileSync('mount', ['-t', 'tmpfs', '-o', 'size=256m', 'tmpfs', many])
    execFileSync('/bin/sh', [
      '-c',
      'cd "$1" && for d in $(seq 60); do mkdir "d$d" && (cd "d$d" && seq 1000 | xargs touch); done',
      'sh',
      many,
    ])
    return many
  }

  // other agents' runs must not wait for it: it gets a CPU and the disk only when they do not want them
  it('walks at idle CPU and I/O priority, in a cgroup of its own capped at half a CPU', async () => {
    const workspace = handedToContainer()
    fs.lchownSync(workspace, 0, 0)
    const many = fillTmpfs(workspace)
    try {
      let priority: string | undefined
      let walkCgroup: string | undefined
      let cpuLimit: string | undefined
      const handing = handWorkspaceTo(workspace, {uid: C, gid: C}, {purpose: 'the container'})
      void handing.finally(() => (priority ??= 'the walk ended before it was seen'))
      while (priority === undefined) {
        const walk = fs
          .readdirSync('/proc')
          .find((pid) => /^\d+$/.test(pid) && readArgv(pid)[0] === 'chown' && readArgv(pid).includes(workspace))
        if (walk) {
          priority = execFileSync('sh', ['-c', `chrt -p ${walk}; ionice -p ${walk}`], {encoding: 'utf8'})
          walkCgroup = cpuCgroupOf(walk)
          cpuLimit = walkCgroup && readCpuLimit(walkCgroup)
        } else await new Promise((resolve) => setTimeout(resolve, 2))
      }
      await handing
      expect(priority).toMatch(/current scheduling policy: SCHED_IDLE\n/)
      expect(priority).toMatch(/^idle$/m)
      if (cgroupSupport().enforced.cpu) {
        expect(walkCgroup).toMatch(/\/meepa-walks\/walk-\d+-\d+$/)
        expect(cpuLimit).toBe('50000 100000')
        expect(fs.existsSync(walkCgroup!)).toBe(false) // removed with the walk
      }
      expect(fs.lstatSync(path.join(many, 'd60', '1000')).uid).toBe(C)
    } finally {
      execFileSync('umount', [many])
    }
  }, 120_000)

  it("what the gateway recreates or writes in a container's workspace belongs to the container's uid (memory.db stays the agent's)", () => {
    const workspace = handedToContainer()
    for (const entry of ['memory.db', 'SOUL.md', 'MEMORY.md', 'skills'])
      fs.rmSync(path.join(workspace, entry), {recursive: true})
    const again = ensureWorkspace(home.home, path.basename(workspace))
    expect(again.created.sort()).toEqual(['MEMORY.md', 'SOUL.md', 'memory.db', 'skills/'])
    writeWorkspaceFile(workspace, 'skills/new/SKILL.md', '# new')
    for (const entry of ['memory.db', 'SOUL.md', 'MEMORY.md', 'skills', 'skills/new', 'skills/new/SKILL.md']) {
      expect([entry, fs.lstatSync(path.join(workspace, entry)).uid]).toEqual([entry, C])
    }
  })

  it('hands over again only after a run as root had the workspace: a second hand-over to the same uid does not walk', async () => {
    const workspace = handedToContainer()
    const file = path.join(workspace, 'SOUL.md')
    await handWorkspaceTo(workspace, {uid: C, gid: C}, {purpose: 'the container'})
    const changed = fs.lstatSync(file).ctimeMs
    await new Promise((resolve) => setTimeout(resolve, 20))
    await handWorkspaceTo(workspace, {uid: C, gid: C}, {purpose: 'the container'})
    expect(fs.lstatSync(file).ctimeMs).toBe(changed) // chown(2) to the same owner would still change it

    await reclaimWorkspace(workspace)
    expect(fs.lstatSync(file).uid).toBe(0)
    fs.writeFileSync(path.join(workspace, 'by-root.txt'), 'a host-sandbox run wrote this')
    await handWorkspaceTo(workspace, {uid: C, gid: C}, {purpose: 'the container'})
    expect(fs.lstatSync(path.join(workspace, 'by-root.txt')).uid).toBe(C)
  })

  it('a cancelled hand-over ends its walk at once and leaves the root as it was, so the next one walks again', async () => {
    const workspace = handedToContainer()
    fs.lchownSync(workspace, 0, 0) // as a run as root leaves it
    const many = fillTmpfs(workspace)
    try {
      const cancel = new AbortController()
      const handing = handWorkspaceTo(workspace, {uid: C, gid: C}, {purpose: 'the container', signal: cancel.signal})
      setTimeout(() => cancel.abort(), 30)
      const started = performance.now()
      await expect(handing).rejects.toThrow(
        /cannot hand the workspace .* to uid 65532 for the container: the run was cancelled/,
      )
      expect(performance.now() - started).toBeLessThan(1000)
      expect(fs.lstatSync(workspace).uid).toBe(0)
      await handWorkspaceTo(workspace, {uid: C, gid: C}, {purpose: 'the container'})
      expect(fs.lstatSync(path.join(many, 'd60', '1000')).uid).toBe(C)
      expect(fs.lstatSync(workspace).uid).toBe(C)
    } finally {
      execFileSync('umount', [many])
    }
  }, 120_000)
})

/** The directory of a process's cpu cgroup (v1 cpu hierarchy or v2), while it runs. */
function cpuCgroupOf(pid: string): string | undefined {
  const text = fs.readFileSync(`/proc/${pid}/cgroup`, 'utf8')
  for (const line of text.split('\n')) {
    const match = /^\d+:([^:]*):(.*)$/.exec(line)
    if (match?.[1]?.split(',').includes('cpu')) return path.join('/sys/fs/cgroup', match[1], match[2]!)
  }
  const unified = /^0::(.*)$/m.exec(text)?.[1]
  return unified === undefined ? undefined : path.join('/sys/fs/cgroup', unified)
}

/** A cgroup's CPU limit as `QUOTA PERIOD`. */
function readCpuLimit(dir: string): string {
  const read = (file: string) => fs.readFileSync(path.join(dir, file), 'utf8').trim()
  return fs.existsSync(path.join(dir, 'cpu.max'))
    ? read('cpu.max')
    : `${read('cpu.cfs_quota_us')} ${read('cpu.cfs_period_us')}`
}

/** A process's argv (empty once it is gone). */
function readArgv(pid: string): string[] {
  try {
    return fs.readFileSync(`/proc/${pid}/cmdline`, 'utf8').split('\0')
  } catch {
    return []
  }
}
