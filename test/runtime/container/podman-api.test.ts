import fs from 'node:fs'
import os from 'node:os'
import path from 'node:path'
import {afterAll, beforeAll, describe, expect, it, vi} from 'vitest'
import {startUnrulyEngine, type Misbehaviour, type UnrulyEngine} from '../../fakes/unruly-engine.js'
import {makeCertificates} from '../../helpers/own-engine.js'
import {waitFor} from '../../helpers/wait-for.js'
import {pingPodman} from '../../../src/runtime/container/podman-api.js'
import {podmanHostForRun, probedPodmanHost} from '../../../src/runtime/container/podman-limits.js'
import type {EngineConfig} from '../../../src/runtime/config/types.js'
import {EngineApi} from '../../../src/sandbox/docker/engine-api.js'
import {settledWithin} from '../../../src/runtime/util/settled-within.js'

/*
 * Engines of the test's own that answer badly (test/fakes/unruly-engine.ts), asked the way the
 * gateway asks a Podman engine itself (its ping, its libpod/info) on each way it reaches one:
 * over mutual TLS, over a unix socket, over ssh. Each call must end by its deadline, collect no
 * more than its cap, and say what went wrong; a probe that failed is asked again.
 */

const podman = (name: string, host: string, more: Partial<EngineConfig> = {}): EngineConfig => ({
  name,
  host,
  kind: 'podman',
  max_runs: 1,
  insecure: false,
  best_effort: false,
  ...more,
})
/** Fails the test, rather than hanging it, when `promise` has not settled within `ms`. */
const within = <T>(promise: Promise<T>, ms: number) =>
  settledWithin(promise, ms, () => new Error(`still pending after ${ms} ms`))
const timed = async (promise: Promise<unknown>) => {
  const started = Date.now()
  const error = await promise.then(
    () => new Error('it answered'),
    (caught: unknown) => caught as Error,
  )
  return {error, ms: Date.now() - started}
}

describe('a Podman engine over mutual TLS that answers badly', () => {
  const certificates = fs.mkdtempSync(path.join(os.tmpdir(), 'meepa-unruly-tls-'))
  const engines = new Map<Misbehaviour, UnrulyEngine>()
  let client: EngineConfig['tls']

  beforeAll(async () => {
    const made = makeCertificates(certificates)
    client = {ca: made.client.ca, cert: made.client.cert, key: made.client.key}
    for (const misbehaviour of ['trickle', 'cut', 'flood'] as const)
      engines.set(misbehaviour, await startUnrulyEngine(misbehaviour, {tls: made.server}))
  })
  afterAll(async () => {
    for (const engine of engines.values()) await engine.close()
    fs.rmSync(certificates, {recursive: true, force: true})
  })
  const over = (misbehaviour: Misbehaviour) => podman(misbehaviour, engines.get(misbehaviour)!.host, {tls: client})

  it('one that trickles a byte every 500 ms is cut at the ping deadline, not kept alive by each byte', async () => {
    const {error, ms} = await timed(within(pingPodman(over('trickle'), 2000), 6000))
    expect(error.message).toMatch(/no whole answer within 2000 ms/)
    expect(ms).toBeLessThan(3000)
  })

  it('one that promises 1000 bytes, sends 2 and drops the connection fails at once, saying so', async () => {
    const {error, ms} = await timed(within(pingPodman(over('cut'), 2000), 6000))
    expect(error.message).toMatch(/closed before the whole answer to GET \/_ping|aborted/)
    expect(ms).toBeLessThan(1500)
  })

  it('one that floods is cut after 1 MiB, naming the engine and the cause', async () => {
    const {error, ms} = await timed(within(pingPodman(over('flood'), 5000), 6000))
    expect(error).toMatchObject({
      code: 'E_DOCKER',
      message: expect.stringMatching(
        /^Podman engine flood \(tcp:\/\/127\.0\.0\.1:\d+\) sent more than 1 MiB in answer to GET \/_ping, so the connection was cut/,
      ),
    })
    expect(ms).toBeLessThan(2000)
  })

  it('a limits probe that gets no whole answer fails by its deadline and is asked again next time', async () => {
    const trickle = engines.get('trickle')!
    const engine = over('trickle')
    const before = trickle.requests
    const {error, ms} = await timed(within(probedPodmanHost(engine), 9000))
    expect(error.message).toMatch(/could not ask Podman engine trickle which limits it can apply/)
    expect(ms).toBeLessThan(7000)
    // not the failed promise from the cache: a new question to the engine
    const again = probedPodmanHost(engine)
    again.catch(() => {})
    await waitFor('the engine is asked again', () => trickle.requests === before + 2, 3000)
  }, 20_000)
})

describe('a Podman engine on a unix socket or over ssh that floods', () => {
  let flood: UnrulyEngine
  let hang: UnrulyEngine
  let bin: string

  beforeAll(async () => {
    flood = await startUnrulyEngine('flood')
    hang = await startUnrulyEngine('hang')
    // a stand-in for the real ssh client (the wrapper runs the first `ssh` on PATH after itself):
    // its `podman system dial-stdio` is a pipe to the flooding engine's socket
    bin = fs.mkdtempSync(path.join(os.tmpdir(), 'meepa-fake-ssh-'))
    fs.writeFileSync(
      path.join(bin, 'ssh'),
      `#!${process.execPath}
const fs = require('node:fs')
fs.writeFileSync(${JSON.stringify(path.join(bin, 'pid'))}, String(process.pid))
const socket = require('node:net').connect(${JSON.stringify(flood.socket)})
process.stdin.pipe(socket, {end: false})
socket.pipe(process.stdout)
`,
      {mode: 0o755},
    )
  })
  afterAll(async () => {
    vi.unstubAllEnvs()
    await flood.close()
    await hang.close()
    fs.rmSync(bin, {recursive: true, force: true})
  })

  it('on its socket, a ping is cut after 1 MiB; a container list after its own, larger cap', async () => {
    const {error, ms} = await timed(within(pingPodman(podman('sock', flood.host), 5000), 6000))
    expect(error.message).toMatch(/^the engine at unix:\/\/\S+ sent more than 1 MiB in answer to GET \/_ping/)
    expect(ms).toBeLessThan(2000)
    const listed = await timed(within(new EngineApi(flood.socket!).containers([], {timeoutMs: 10_000}), 11_000))
    expect(listed.error).toMatchObject({
      code: 'E_DOCKER',
      message: expect.stringMatching(/sent more than 32 MiB in answer to GET \/containers\/json/),
    })
    expect(listed.ms).toBeLessThan(8000)
  }, 20_000)

  it('over ssh, a ping is cut after 1 MiB and the ssh client is killed', async () => {
    vi.stubEnv('PATH', `${bin}:${process.env.PATH}`)
    const {error, ms} = await timed(within(pingPodman(podman('far', 'ssh://me@far.example'), 5000), 6000))
    expect(error.message).toMatch(/^Podman engine far \(ssh:\/\/me@far\.example\) sent more than 1 MiB/)
    expect(ms).toBeLessThan(3000)
    const pid = Number(fs.readFileSync(path.join(bin, 'pid'), 'utf8'))
    await waitFor(`the ssh client ${pid} is gone`, () => !alive(pid), 3000)
  })

  it("a run waiting for a probe stops at its cancel, and at its timeout, not at the probe's", async () => {
    const engine = podman('hung', hang.host)
    const controller = new AbortController()
    setTimeout(() => controller.abort(), 100)
    const cancelled = await timed(within(podmanHostForRun(engine, 60_000, controller.signal), 4000))
    expect(cancelled.error).toMatchObject({code: 'E_RUN', message: expect.stringMatching(/cancelled/)})
    expect(cancelled.ms).toBeLessThan(1000)
    const late = await timed(within(podmanHostForRun({...engine, name: 'hung2'}, 300, undefined), 4000))
    expect(late.error.message).toMatch(/could not ask Podman engine hung2 .*within the run's 0.3 s/)
    expect(late.ms).toBeLessThan(1000)
  })
})

function alive(pid: number): boolean {
  try {
    process.kill(pid, 0)
    return true
  } catch {
    return false
  }
}
