import fs from 'node:fs'
import path from 'node:path'
import {afterAll, beforeAll, describe, expect, it} from 'vitest'
import {kernelGaps} from '../../../src/sandbox/landlock/enforcement.js'
import {runCli} from '../../helpers/home.js'
import {makeEscapeWorld, requireLandlockOrSkip, type EscapeWorld} from '../../helpers/landlock-support.js'

describe('kernel gaps (the fail-closed decision)', () => {
  const probe = (abi: number, seccomp = true) => ({
    landlock: {abi, ...(abi === 0 ? {errno: 'EOPNOTSUPP', reason: 'not in lsm='} : {})},
    seccomp,
    arch: 'x86_64',
  })
  it('finds none on ABI 6+ with seccomp', () => {
    expect(kernelGaps(probe(6), 'deny')).toEqual([])
    expect(kernelGaps(probe(7), 'allow')).toEqual([])
  })
  it('names each missing piece', () => {
    expect(kernelGaps(probe(0), 'allow')).toEqual(['file rules: Landlock is unavailable (EOPNOTSUPP: not in lsm=)'])
    expect(kernelGaps(probe(2), 'allow').join('\n')).toMatch(/truncate.*ABI 3[\s\S]*ioctl.*ABI 5[\s\S]*signals.*ABI 6/)
    expect(kernelGaps(probe(3, false), 'deny').join('\n')).toMatch(
      /seccomp filter unavailable[\s\S]*UDP, raw and packet[\s\S]*TCP is not blocked/,
    )
    expect(kernelGaps(probe(6, false), 'allow')).toHaveLength(1)
  })
})

const enabled = requireLandlockOrSkip('sandbox explain/check command tests')

describe.skipIf(!enabled)('sandbox explain and sandbox check', () => {
  let world: EscapeWorld
  beforeAll(() => {
    world = makeEscapeWorld('http://127.0.0.1:9/v1', {
      id: 'lenient',
      file_access: {deny: ['private'], best_effort: true},
    })
    fs.mkdirSync(path.join(world.workspace('lenient'), 'private'), {recursive: true})
  })
  afterAll(() => world.cleanup())
  const cli = (...args: string[]) => runCli(['sandbox', ...args], {home: world.home, env: {HOME: world.operatorHome}})
  const cliWithoutNamespaces = (...args: string[]) =>
    runCli(['sandbox', ...args], {home: world.home, env: {HOME: world.operatorHome, MEEPA_SANDBOX_NO_NAMESPACES: '1'}})

  it('explain --json: with namespaces a deny inside the workspace is covered and the workspace keeps its full grant', async () => {
    const result = await cli('explain', '--agent', 'locked', '--json')
    expect(result.exitCode, result.stderr).toBe(0)
    const {report} = JSON.parse(result.stdout)
    expect(report.enforced).toBe(true)
    expect(report.namespaces).toMatchObject({available: true, tool: expect.stringMatching(/bwrap$/)})
    const ws = fs.realpathSync(world.workspace('locked'))
    expect(report.rules).toContainEqual(
      expect.objectContaining({
        path: ws,
        rights: expect.arrayContaining(['make_reg', 'make_dir', 'remove_file', 'refer']),
      }),
    )
    expect(report.namespaces.covered).toContainEqual(
      expect.objectContaining({path: path.join(ws, 'private'), kind: 'dir'}),
    )
    expect(report.namespaces.covered).toContainEqual(expect.objectContaining({path: world.shared.blocked, kind: 'dir'}))
    expect(report.denies).toContainEqual(
      expect.objectContaining({
        path: path.join(ws, 'private'),
        mechanism: expect.stringMatching(/^covered in the mount namespace/),
      }),
    )
    expect(report.limits.join('\n')).not.toContain(`${ws}: listing only`)
    expect(report.process.map((entry: {what: string}) => entry.what)).toEqual(
      expect.arrayContaining(['other processes', 'pseudo-terminals']),
    )
  })

  it('explain --json without namespaces: the lowering stays, the directories that lose create rights are named as gaps', async () => {
    const result = await cliWithoutNamespaces('explain', '--agent', 'locked', '--json')
    expect(result.exitCode, result.stderr).toBe(0)
    const {report} = JSON.parse(result.stdout)
    expect(report.kernel.landlock_abi).toBeGreaterThanOrEqual(6)
    expect(report.namespaces).toMatchObject({
      available: false,
      unavailable: expect.stringContaining('MEEPA_SANDBOX_NO_NAMESPACES'),
    })
    expect(report.enforced).toBe(false)
    const ws = fs.realpathSync(world.workspace('locked'))
    const gaps = report.gaps.join('\n')
    expect(gaps).toContain(
      `${ws} loses create, rename and delete rights (listing only) because ${path.join(ws, 'private')} is denied beneath it`,
    )
    expect(gaps).toContain(
      `${world.shared.readWrite} loses create, rename and delete rights (listing only) because ${world.shared.blocked} is denied beneath it`,
    )
    // the workspace holds a denied entry: its root is listing-only and its other entries keep read-write
    expect(report.rules).toContainEqual(
      expect.objectContaining({
        path: ws,
        rights: ['read_dir'],
        mechanism: expect.stringMatching(/^Landlock path rule/),
      }),
    )
    expect(report.rules).toContainEqual(
      expect.objectContaining({
        path: path.join(ws, 'work'),
        rights: expect.arrayContaining(['write_file', 'make_reg']),
      }),
    )
    expect(report.rules.some((rule: {path: string}) => rule.path.startsWith(path.join(ws, 'private')))).toBe(false)
    expect(report.denies).toContainEqual(expect.objectContaining({path: path.join(ws, 'private'), source: 'config'}))
    expect(report.denies).toContainEqual(expect.objectContaining({path: world.home, source: 'mandatory'}))
    expect(report.denies).toContainEqual(
      expect.objectContaining({path: path.join(world.operatorHome, '.ssh'), source: 'mandatory'}),
    )
    expect(report.network).toMatchObject({
      mode: 'deny',
      enforced_by: [
        expect.stringMatching(/agent-run and everything it starts.*gateway calls the provider/),
        expect.stringMatching(/Landlock: TCP/),
        expect.stringMatching(/seccomp: socket\(\) denied/),
      ],
    })
    expect(report.process).toContainEqual(
      expect.objectContaining({what: 'provider API keys', mechanism: expect.stringMatching(/stay in the gateway/)}),
    )
    expect(report.limits.join('\n')).toContain(
      `${ws}: listing only, because ${path.join(ws, 'private')} is denied beneath it`,
    )
  })

  it('without namespaces, exec refuses unless best_effort: unprotected file metadata, and the create rights a policy costs, named with the fix', async () => {
    const refused = await cliWithoutNamespaces('exec', '--agent', 'locked', '--', 'true')
    expect(refused.exitCode).not.toBe(0)
    const stderr = refused.stderr.replace(/\s*›\s*/g, ' ')
    expect(stderr).toContain(`${fs.realpathSync(world.workspace('locked'))} loses create, rename and delete rights`)
    expect(stderr).toMatch(/install bubblewrap/)
    const open = await cliWithoutNamespaces('exec', '--agent', 'open', '--', 'true')
    expect(open.exitCode).toBe(9)
    expect(open.stderr.replace(/\s*›\s*/g, ' ')).toMatch(
      /file metadata outside the writable grants \(chmod, chown, times, extended attributes, attribute flags\) is not protected.*install bubblewrap/,
    )
    const lenient = await cliWithoutNamespaces('exec', '--agent', 'lenient', '--', 'sh', '-c', 'echo new > new.txt')
    expect(lenient.exitCode).not.toBe(0) // ran, with the lowering: no new file in the workspace root
    expect(lenient.stderr).toContain(
      `sandbox: best effort, NOT enforced: ${fs.realpathSync(world.workspace('lenient'))} loses create, rename and delete rights`,
    )
    expect(lenient.stderr).toMatch(/new\.txt: Permission denied/)
    expect(lenient.stderr).toContain('sandbox: best effort, NOT enforced: file metadata outside the writable grants')
  })

  it('config check names the directories that lose create rights, only where namespaces are unavailable', async () => {
    const withNamespaces = await runCli(['config', 'check', '--json'], {
      home: world.home,
      env: {HOME: world.operatorHome},
    })
    expect(withNamespaces.exitCode, withNamespaces.stderr).toBe(0)
    expect(JSON.parse(withNamespaces.stdout).warnings).toEqual([])
    const without = await runCli(['config', 'check'], {
      home: world.home,
      env: {HOME: world.operatorHome, MEEPA_SANDBOX_NO_NAMESPACES: '1'},
    })
    expect(without.exitCode).toBe(0)
    const ws = fs.realpathSync(world.workspace('locked'))
    expect(without.stderr).toContain(
      `warning: agent locked: ${ws} loses create, rename and delete rights (listing only) because ${path.join(ws, 'private')} is denied beneath it`,
    )
    expect(without.stderr).toMatch(/agent locked: .*runs are refused unless file_access\.best_effort: true/)
    expect(without.stderr).toMatch(/agent lenient: .*accepted: best_effort is on/)
  })

  it('explain prints a readable report', async () => {
    const result = await cli('explain', '--agent', 'open')
    expect(result.exitCode).toBe(0)
    expect(result.stdout).toMatch(/kernel: Landlock ABI \d+, seccomp available/)
    expect(result.stdout).toContain('status: fully enforced')
    expect(result.stdout).toContain('known limits:')
  })

  it('check passes every probe on this kernel, for each host-sandbox agent', async () => {
    const result = await cli('check', '--json')
    expect(result.exitCode, result.stdout + result.stderr).toBe(0)
    const results = JSON.parse(result.stdout) as Array<{
      agent: string
      probes: Array<{name: string; pass: boolean; skipped?: boolean; detail?: string}>
    }>
    expect(results.map((entry) => entry.agent)).toEqual(['locked', 'open', 'other', 'lenient'])
    for (const entry of results) {
      const failed = entry.probes.filter((probe) => !probe.pass)
      expect(failed, JSON.stringify(failed)).toEqual([])
      const attempted = entry.probes.filter((probe) => !probe.skipped).map((probe) => probe.name)
      expect(attempted.join('\n')).toMatch(
        /read the gateway config[\s\S]*read an operator dotfile[\s\S]*write outside the workspace[\s\S]*TCP connect/,
      )
    }
    const locked = results
      .find((entry) => entry.agent === 'locked')!
      .probes.map((probe) => probe.name)
      .join('\n')
    expect(locked).toMatch(/rename denied .*secret|create a file in denied .*private/)
    expect(locked).toMatch(/UDP send to 127\.0\.0\.1/)
  })

  it('exec passes the argv after "--" through untouched: repeated words, flag-like words, a second "--"', async () => {
    const echoed = await cli('exec', '--agent', 'open', '--', 'echo', 'a', 'b', 'a')
    expect(echoed.exitCode, echoed.stderr).toBe(0)
    expect(echoed.stdout).toBe('a b a')
    const printed = await cli(
      'exec',
      '--agent',
      'open',
      '--',
      'sh',
      '-c',
      'printf "%s|" "$0" "$@"',
      'sh',
      'a',
      'b',
      'a',
      '--agent',
      'x',
      '-a',
      '--help',
      '--',
      'a',
    )
    expect(printed.exitCode, printed.stderr).toBe(0)
    expect(printed.stdout).toBe('sh|a|b|a|--agent|x|-a|--help|--|a|')
  })

  it('exec without a command is a usage error', async () => {
    const result = await cli('exec', '--agent', 'open')
    expect(result.exitCode).toBe(2)
    expect(result.stderr).toContain('no command given')
  })
})
