import {execa} from 'execa'
import fs from 'node:fs'
import os from 'node:os'
import path from 'node:path'
import {afterAll, beforeAll, describe, expect, it} from 'vitest'
import {READ_RIGHTS, READ_WRITE_RIGHTS} from '../../../src/sandbox/landlock/rights.js'
import {serializeRules} from '../../../src/sandbox/landlock/rules-file.js'
import type {PolicyRule} from '../../../src/sandbox/policy.js'
import {HELPER, requireLandlockOrSkip} from '../../helpers/landlock-support.js'

// The C helper on its own: rules parsing, fail-closed decisions, what the exec'd command inherits.
const enabled = requireLandlockOrSkip('sandbox helper tests')

describe.skipIf(!enabled)('meepa-sandbox helper', () => {
  let dir: string
  beforeAll(() => {
    dir = fs.realpathSync(fs.mkdtempSync(path.join(os.tmpdir(), 'meepa-helper-')))
  })
  afterAll(() => fs.rmSync(dir, {recursive: true, force: true}))

  const baseRules = (): PolicyRule[] => [
    ...['/usr', '/etc', '/proc'].map((target) => ({path: target, rights: [...READ_RIGHTS], reason: 'system'})),
    ...(fs.existsSync('/lib64') ? [{path: fs.realpathSync('/lib64'), rights: [...READ_RIGHTS], reason: 'system'}] : []),
    {path: '/dev/null', rights: ['read_file', 'write_file', 'truncate'], reason: 'device'},
    {path: dir, rights: [...READ_WRITE_RIGHTS], reason: 'workspace'},
  ]
  const run = (rulesText: string, argv: string[], env: Record<string, string> = {}, extraFd = false) => {
    const child = execa(HELPER, ['--rules-fd', '3', '--', ...argv], {
      env,
      extendEnv: false,
      reject: false,
      timeout: 15_000,
      detached: true,
      stdio: extraFd ? ['ignore', 'pipe', 'pipe', 'pipe', 'pipe'] : ['ignore', 'pipe', 'pipe', 'pipe'],
    })
    ;(child.stdio[3] as unknown as NodeJS.WritableStream).end(rulesText)
    return child
  }
  const rules = (options: {network?: 'allow' | 'deny'; bestEffort?: boolean; env?: Record<string, string>} = {}) =>
    serializeRules(
      {rules: baseRules(), network: options.network ?? 'deny', listen: 'deny', bestEffort: options.bestEffort ?? false},
      options.env ?? {PATH: '/usr/bin:/bin'},
    )

  it('probes the kernel and prints JSON', async () => {
    const result = await execa(HELPER, ['--probe'], {timeout: 10_000})
    const probe = JSON.parse(result.stdout)
    expect(probe.landlock.abi).toBeGreaterThanOrEqual(6)
    expect(probe.seccomp).toBe(true)
  })

  it('gives the command exactly the environment from the rules', async () => {
    const result = await run(rules({env: {PATH: '/usr/bin:/bin', HOME: dir, ONLY: 'this'}}), ['/usr/bin/env'], {
      SECRET_FROM_PARENT: 'leak',
    })
    expect(result.exitCode).toBe(0)
    expect(result.stdout.split('\n').sort()).toEqual([`HOME=${dir}`, 'ONLY=this', 'PATH=/usr/bin:/bin'])
  })

  it('closes inherited descriptors above 2 and starts a new session', async () => {
    const result = await run(
      rules(),
      ['/bin/sh', '-c', 'ls /proc/self/fd | sort -n | tr "\\n" " "; echo; ps -o sid= -p $$; echo $$'],
      {PATH: '/usr/bin:/bin'},
      true,
    )
    const [fds, sid, pid] = result.stdout.split('\n').map((line) => line.trim())
    // 0-2, plus the fd ls itself opens to list the directory
    expect(
      fds!
        .split(' ')
        .filter(Boolean)
        .map(Number)
        .filter((fd) => fd > 3),
    ).toEqual([])
    expect(sid).toBe(pid)
  })

  it('refuses truncated rules, unknown rights and relative paths (exit 125, nothing runs)', async () => {
    const full = rules()
    const truncated = full.slice(0, full.indexOf('end'))
    for (const text of [
      truncated,
      full.replace('read_file', 'read_everything'),
      full.replace(`path ${READ_RIGHTS.join(',')} /usr`, 'path read_file usr'),
      'garbage\nend\n',
    ]) {
      const result = await run(text, ['/bin/sh', '-c', `touch ${dir}/ran`])
      expect(result.exitCode).toBe(125)
      expect(result.stderr).toMatch(/^meepa-sandbox: /)
      expect(fs.existsSync(path.join(dir, 'ran'))).toBe(false)
    }
  })

  it('fails closed when the kernel lacks a part of the policy, naming it', async () => {
    const oldKernel = await run(rules(), ['/bin/true'], {MEEPA_SANDBOX_FAKE_ABI: '4'})
    expect(oldKernel.exitCode).toBe(125)
    expect(oldKernel.stderr).toContain('cannot enforce: ioctl on device files (needs Landlock ABI 5')
    expect(oldKernel.stderr).toContain('cannot enforce: signals to processes outside the sandbox (needs Landlock ABI 6')
    expect(oldKernel.stderr).toContain('refusing to run')
    const noLandlock = await run(rules(), ['/bin/true'], {MEEPA_SANDBOX_FAKE_ABI: '0'})
    expect(noLandlock.exitCode).toBe(125)
    expect(noLandlock.stderr).toContain('Landlock is unavailable (ENOSYS')
    const noSeccomp = await run(rules(), ['/bin/true'], {MEEPA_SANDBOX_FAKE_NO_SECCOMP: '1'})
    expect(noSeccomp.exitCode).toBe(125)
    expect(noSeccomp.stderr).toContain('network off: UDP, raw and packet sockets are not blocked')
  })

  it('runs with best_effort and prints every gap', async () => {
    const result = await run(rules({bestEffort: true}), ['/bin/sh', '-c', `echo ok > ${dir}/best-effort`], {
      MEEPA_SANDBOX_FAKE_ABI: '4',
      PATH: '/usr/bin:/bin',
    })
    expect(result.exitCode).toBe(0)
    expect(result.stderr).toContain('best effort, NOT enforced: signals to processes outside the sandbox')
    expect(fs.readFileSync(path.join(dir, 'best-effort'), 'utf8')).toBe('ok\n')
  })

  it('adds a network-off layer with --deny-network, keeping the environment', async () => {
    const result = await execa(
      HELPER,
      [
        '--deny-network',
        '--',
        'node',
        '-e',
        "require('net').connect(9,'127.0.0.1').on('error',e=>{console.log(e.code);process.exit(3)})",
      ],
      {
        reject: false,
        timeout: 15_000,
        env: {KEEP: 'me'},
      },
    )
    expect(result.stdout).toBe('EPERM')
    expect(result.exitCode).toBe(3)
    const env = await execa(HELPER, ['--deny-network', '--', 'env'], {timeout: 15_000, env: {KEEP: 'me'}})
    expect(env.stdout).toContain('KEEP=me')
  })

  it('adds a no-listening layer with --deny-listen (the container shell tool): no TCP/UDP bind, no listen()', async () => {
    const script = [
      'import socket',
      'for family, kind, addr in [(socket.AF_INET, socket.SOCK_STREAM, ("127.0.0.1", 0)), (socket.AF_INET, socket.SOCK_DGRAM, ("127.0.0.1", 0)), (socket.AF_INET6, socket.SOCK_STREAM, ("::1", 0))]:',
      '    try: socket.socket(family, kind).bind(addr); print("BOUND")',
      '    except OSError as e: print(e.errno)',
      'try: socket.socket().listen(); print("LISTENING")',
      'except OSError as e: print(e.errno)',
    ].join('\n')
    const denied = await execa(HELPER, ['--new-group', '--deny-listen', '--', 'python3', '-c', script], {
      reject: false,
      timeout: 15_000,
    })
    expect(denied.stdout.split('\n')).toEqual(['1', '1', '1', '1'])
    const allowed = await execa(HELPER, ['--new-group', '--', 'python3', '-c', script], {
      reject: false,
      timeout: 15_000,
    })
    expect(allowed.stdout.split('\n')).toEqual(['BOUND', 'BOUND', 'BOUND', 'LISTENING'])
  })
})
