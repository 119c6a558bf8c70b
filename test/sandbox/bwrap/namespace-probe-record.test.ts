import {execFileSync} from 'node:child_process'
import fs from 'node:fs'
import os from 'node:os'
import path from 'node:path'
import {afterAll, afterEach, beforeAll, describe, expect, it, vi} from 'vitest'

// The namespace probe's remembered success (MEEPAGATEWAY_HOME/cache/namespace-probe.json): a CLI
// start that finds it runs no bwrap. Each case loads namespaces.ts afresh (its per-process answer
// would hide the record) and counts real bwrap runs through a spy on bwrap-probe.ts.
const bwrapRuns = vi.hoisted(() => ({count: 0, fail: undefined as string | undefined}))
vi.mock('../../../src/sandbox/bwrap/bwrap-probe.js', async (importOriginal) => {
  const real = await importOriginal<typeof import('../../../src/sandbox/bwrap/bwrap-probe.js')>()
  return {
    bwrapFailure: async (...args: Parameters<typeof real.bwrapFailure>) => {
      bwrapRuns.count++
      // the one fault this machine cannot have for real without breaking every other test: namespaces refused
      return bwrapRuns.fail ?? real.bwrapFailure(...args)
    },
  }
})

const hasBwrap = ['/usr/bin/bwrap', '/usr/local/bin/bwrap', '/bin/bwrap'].some((file) => fs.existsSync(file))

describe.skipIf(process.platform !== 'linux' || !hasBwrap)('the namespace probe record', () => {
  let home: string
  let record: string
  beforeAll(() => {
    home = fs.mkdtempSync(path.join(os.tmpdir(), 'meepa-probe-record-'))
    record = path.join(home, 'cache', 'namespace-probe.json')
  })
  afterAll(() => fs.rmSync(home, {recursive: true, force: true}))
  afterEach(() => {
    bwrapRuns.fail = undefined
    delete process.env.MEEPA_SANDBOX_NO_NAMESPACES
  })

  /** probeNamespaces of a fresh process: no answer from an earlier call. */
  async function probeInFreshProcess(options: {cacheFile?: string} = {cacheFile: record}) {
    vi.resetModules()
    const {probeNamespaces} = await import('../../../src/sandbox/bwrap/namespaces.js')
    const before = bwrapRuns.count
    const probe = await probeNamespaces(options)
    return {probe, ranBwrap: bwrapRuns.count > before}
  }

  it('remembers a success, private to the operator, and the next start trusts it without running bwrap', async () => {
    expect(await probeInFreshProcess()).toMatchObject({probe: {available: true}, ranBwrap: true})
    expect(fs.statSync(record).mode & 0o777).toBe(0o600)
    expect(fs.statSync(path.dirname(record)).mode & 0o777).toBe(0o700)
    expect(await probeInFreshProcess()).toMatchObject({
      probe: {available: true, bwrap: expect.stringMatching(/bwrap$/)},
      ranBwrap: false,
    })
  })

  it('probes again when the record is of another machine state, too old, damaged or not asked for', async () => {
    await probeInFreshProcess()
    const good = JSON.parse(fs.readFileSync(record, 'utf8')) as {key: string; at: number}
    expect(good.key).toContain(fs.readFileSync('/proc/sys/kernel/random/boot_id', 'utf8').trim())

    fs.writeFileSync(
      record,
      JSON.stringify({...good, key: good.key.replace(/"[0-9a-f-]{36}"/, '"00000000-0000-0000-0000-000000000000"')}),
    )
    expect(await probeInFreshProcess()).toMatchObject({probe: {available: true}, ranBwrap: true})
    expect(JSON.parse(fs.readFileSync(record, 'utf8')).key).toBe(good.key) // rewritten for this boot

    fs.writeFileSync(record, JSON.stringify({...good, at: Date.now() - 2 * 60 * 60_000}))
    expect((await probeInFreshProcess()).ranBwrap).toBe(true)

    fs.writeFileSync(record, '{"key": ')
    expect((await probeInFreshProcess()).ranBwrap).toBe(true)

    expect((await probeInFreshProcess({})).ranBwrap).toBe(true)
  })

  it('reads the record safely: a FIFO, a symlink to a device or a huge file there is no record, and nothing blocks', async () => {
    const target = path.join(home, 'huge')
    fs.writeFileSync(target, Buffer.alloc(1 << 20, 0x20))
    for (const plant of [
      () => execFileSync('mkfifo', [record]),
      () => fs.symlinkSync('/dev/zero', record),
      () => fs.symlinkSync(target, record),
      () => fs.copyFileSync(target, record),
    ]) {
      fs.rmSync(record, {force: true})
      plant()
      expect(await probeInFreshProcess()).toMatchObject({probe: {available: true}, ranBwrap: true})
      // the probe's success replaced what was planted with a record of its own
      expect(fs.lstatSync(record).isFile()).toBe(true)
      expect(JSON.parse(fs.readFileSync(record, 'utf8'))).toMatchObject({answer: true})
    }
  })

  it('never remembers a failure, and the record cannot switch on a layer the operator switched off', async () => {
    fs.rmSync(record, {force: true})
    bwrapRuns.fail = 'setting up uid map: Permission denied'
    expect((await probeInFreshProcess()).probe).toMatchObject({
      available: false,
      reason: expect.stringContaining('Permission denied'),
    })
    expect(fs.existsSync(record)).toBe(false)

    bwrapRuns.fail = undefined
    await probeInFreshProcess()
    expect(fs.existsSync(record)).toBe(true)
    process.env.MEEPA_SANDBOX_NO_NAMESPACES = '1'
    expect(await probeInFreshProcess()).toMatchObject({probe: {available: false}, ranBwrap: false})
  })
})

// The kernel probe's record (kernel-probe.json): the helper's own answer, for this boot and this binary.
const helperRuns = vi.hoisted(() => ({count: 0}))
vi.mock('../../../src/runtime/util/subprocess.js', async (importOriginal) => {
  const real = await importOriginal<typeof import('../../../src/runtime/util/subprocess.js')>()
  return {
    startSubprocess: (...args: Parameters<typeof real.startSubprocess>) => {
      if (args[1].includes('--probe')) helperRuns.count++
      return real.startSubprocess(...args)
    },
  }
})

describe.skipIf(process.platform !== 'linux')('the kernel probe record', () => {
  let home: string
  let record: string
  beforeAll(() => {
    home = fs.mkdtempSync(path.join(os.tmpdir(), 'meepa-kernel-record-'))
    record = path.join(home, 'cache', 'kernel-probe.json')
  })
  afterAll(() => fs.rmSync(home, {recursive: true, force: true}))

  async function probeInFreshProcess(helper?: string) {
    vi.resetModules()
    const {probeKernel, requireHelper} = await import('../../../src/sandbox/landlock/helper.js')
    const before = helperRuns.count
    const probe = await probeKernel(helper ?? requireHelper(), {cacheFile: record})
    return {probe, ranHelper: helperRuns.count > before}
  }

  it("remembers the helper's answer for this boot and binary, and asks again for another binary", async () => {
    const first = await probeInFreshProcess()
    expect(first.ranHelper).toBe(true)
    expect(first.probe.landlock.abi).toBeGreaterThan(0)
    expect(fs.statSync(record).mode & 0o777).toBe(0o600)
    expect(await probeInFreshProcess()).toEqual({probe: first.probe, ranHelper: false})

    // the same helper at another path (another build or install): its own answer
    const {requireHelper} = await import('../../../src/sandbox/landlock/helper.js')
    const copy = path.join(home, 'meepa-sandbox')
    fs.copyFileSync(requireHelper(), copy)
    fs.chmodSync(copy, 0o755)
    expect((await probeInFreshProcess(copy)).ranHelper).toBe(true)

    fs.writeFileSync(record, '{"key": 1')
    expect((await probeInFreshProcess()).ranHelper).toBe(true)
  })
})
