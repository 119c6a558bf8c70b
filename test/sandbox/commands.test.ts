import fs from 'node:fs'
import path from 'node:path'
import {afterAll, beforeAll, describe, expect, it} from 'vitest'
import {kernelGaps} from '../../src/sandbox/landlock/enforcement.js'
import {runCli} from '../helpers/home.js'
import {makeEscapeWorld, requireLandlockOrSkip, type EscapeWorld} from './landlock-support.js'

describe('kernel gaps (the fail-closed decision)', () => {
  const probe = (abi: number, seccomp = true) => ({landlock: {abi, ...(abi === 0 ? {errno: 'EOPNOTSUPP', reason: 'not in lsm='} : {})}, seccomp, arch: 'x86_64'})
  it('finds none on ABI 6+ with seccomp', () => {
    expect(kernelGaps(probe(6), 'deny')).toEqual([])
    expect(kernelGaps(probe(7), 'allow')).toEqual([])
  })
  it('names each missing piece', () => {
    expect(kernelGaps(probe(0), 'allow')).toEqual(['file rules: Landlock is unavailable (EOPNOTSUPP: not in lsm=)'])
    expect(kernelGaps(probe(2), 'allow').join('\n')).toMatch(/truncate.*ABI 3[\s\S]*ioctl.*ABI 5[\s\S]*signals.*ABI 6/)
    expect(kernelGaps(probe(3, false), 'deny').join('\n')).toMatch(/seccomp filter unavailable[\s\S]*UDP, raw and packet[\s\S]*TCP is not blocked/)
    expect(kernelGaps(probe(6, false), 'allow')).toHaveLength(1)
  })
})

const enabled = requireLandlockOrSkip('sandbox explain/check command tests')

describe.skipIf(!enabled)('sandbox explain and sandbox check', () => {
  let world: EscapeWorld
  beforeAll(() => {
    world = makeEscapeWorld('http://127.0.0.1:9/v1')
  })
  afterAll(() => world.cleanup())
  const cli = (...args: string[]) => runCli(['sandbox', ...args], {home: world.home, env: {HOME: world.operatorHome}})

  it('explain --json lists every rule with its mechanism, the denies, the ABI and the limits of the lowering', async () => {
    const result = await cli('explain', '--agent', 'locked', '--json')
    expect(result.exitCode, result.stderr).toBe(0)
    const {report} = JSON.parse(result.stdout)
    expect(report.kernel.landlock_abi).toBeGreaterThanOrEqual(6)
    expect(report.enforced).toBe(true)
    const ws = fs.realpathSync(world.workspace('locked'))
    // the workspace holds a denied entry: its root is listing-only and its other entries keep read-write
    expect(report.rules).toContainEqual(expect.objectContaining({path: ws, rights: ['read_dir'], mechanism: expect.stringMatching(/^Landlock path rule/)}))
    expect(report.rules).toContainEqual(expect.objectContaining({path: path.join(ws, 'work'), rights: expect.arrayContaining(['write_file', 'make_reg'])}))
    expect(report.rules.some((rule: {path: string}) => rule.path.startsWith(path.join(ws, 'private')))).toBe(false)
    expect(report.denies).toContainEqual(expect.objectContaining({path: path.join(ws, 'private'), source: 'config'}))
    expect(report.denies).toContainEqual(expect.objectContaining({path: world.home, source: 'mandatory'}))
    expect(report.denies).toContainEqual(expect.objectContaining({path: path.join(world.operatorHome, '.ssh'), source: 'mandatory'}))
    expect(report.network).toMatchObject({mode: 'deny', enforced_by: [expect.stringMatching(/agent-run and everything it starts.*gateway calls the provider/), expect.stringMatching(/Landlock: TCP/), expect.stringMatching(/seccomp: socket\(\) denied/)]})
    expect(report.process).toContainEqual(expect.objectContaining({what: 'provider API keys', mechanism: expect.stringMatching(/stay in the gateway/)}))
    expect(report.limits.join('\n')).toContain(`${ws}: listing only, because ${path.join(ws, 'private')} is denied beneath it`)
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
    const results = JSON.parse(result.stdout) as Array<{agent: string; probes: Array<{name: string; pass: boolean; skipped?: boolean; detail?: string}>}>
    expect(results.map((entry) => entry.agent)).toEqual(['locked', 'open', 'other'])
    for (const entry of results) {
      const failed = entry.probes.filter((probe) => !probe.pass)
      expect(failed, JSON.stringify(failed)).toEqual([])
      const attempted = entry.probes.filter((probe) => !probe.skipped).map((probe) => probe.name)
      expect(attempted.join('\n')).toMatch(/read the gateway config[\s\S]*read an operator dotfile[\s\S]*write outside the workspace[\s\S]*TCP connect/)
    }
    const locked = results.find((entry) => entry.agent === 'locked')!.probes.map((probe) => probe.name).join('\n')
    expect(locked).toMatch(/rename denied .*secret|create a file in denied .*private/)
    expect(locked).toMatch(/UDP send to 127\.0\.0\.1/)
  })

  it('exec without a command is a usage error', async () => {
    const result = await cli('exec', '--agent', 'open')
    expect(result.exitCode).toBe(2)
    expect(result.stderr).toContain('no command given')
  })
})
