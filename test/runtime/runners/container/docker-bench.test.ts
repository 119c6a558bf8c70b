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
import {describeWithDocker} from '../../../helpers/docker-env.js'
import {startOwnEngine, type OwnEngine} from '../../../helpers/own-engine.js'

/*
 * docker-bench-security 1.6.0 (test/fixtures/docker-bench-security: its script, its helpers and its
 * container runtime section, CIS Docker Benchmark section 5, unchanged), run against a run
 * container waiting on the local engine and one waiting on a remote engine (a dockerd of the
 * test's own, reached over tcp:// with mutual TLS, as the gateway reaches it): every check must
 * give the same result on both, and the hardening checks must pass.
 */

const BENCH = path.resolve(__dirname, '../../../fixtures/docker-bench-security')

/** What section 5 must find on every engine: caps, privileges, host dirs and namespaces, limits, read-only root, no socket. */
const MUST_PASS = {
  '5.4': 'capabilities restricted',
  '5.5': 'not privileged',
  '5.6': 'no sensitive host directory mounted',
  '5.10': "the host's network namespace not shared",
  '5.11': 'memory limited',
  '5.13': 'root filesystem read-only',
  '5.16': "the host's process namespace not shared",
  '5.17': "the host's IPC namespace not shared",
  '5.18': 'no host device',
  '5.21': "the host's UTS namespace not shared",
  '5.22': 'the default seccomp profile on',
  '5.26': 'no new privileges',
  '5.29': 'a PIDs limit',
  '5.31': "the host's user namespace not shared",
  '5.32': 'the Docker socket not mounted',
}

interface BenchCheck {
  id: string
  desc: string
  result: string
  items?: string[]
}

describeWithDocker('docker-bench-security, container runtime: a remote engine gives what the local one gives', () => {
  let engine: OwnEngine
  let llm: FakeLlm
  let home: TestHome
  let serve: (ServeProcess & {apiKey: string}) | undefined
  const scratch = fs.mkdtempSync(path.join(os.tmpdir(), 'meepa-bench-sec-'))
  const localHost = process.env.DOCKER_HOST || 'unix:///var/run/docker.sock'

  beforeAll(async () => {
    engine = await startOwnEngine({tls: true, port: await freePort()})
    llm = await startFakeLlm()
    llm.setDefault(shellScripted)
    const tls = engine.tls!
    const port = await freePort()
    const agent = (id: string, engines: string[]) => ({
      id,
      container_mode: {enabled: true, network: 'none', memory_limit: '512m', timeout_seconds: 60, engines},
    })
    home = makeHome(
      fakeLlmConfig(llm.openaiBaseUrl, [agent('far', ['remote']), agent('near', ['local'])], {
        captain: {enabled: true, bind: '127.0.0.1', port},
        engines: [
          {name: 'remote', host: tls.host, tls: {ca: tls.ca, cert: tls.cert, key: tls.key}, max_runs: 2},
          {name: 'local', host: localHost},
        ],
      }),
    )
    serve = await startServe({home: home.home, port})
    // each first message builds the isolation image on its engine; then a standby waits there
    for (const id of ['far', 'near'])
      expect((await serve.chat(id, 'hello')).reply, serve.output().slice(-3000)).toBe('pong')
  }, 900_000)

  afterAll(async () => {
    if (serve && serve.process.exitCode === null) await serve.stop()
    await engine?.destroy()
    await llm?.close()
    home?.cleanup()
    fs.rmSync(scratch, {recursive: true, force: true})
  }, 120_000)

  /** The agent's standby container on an engine, once it waits there: its name. */
  const standbyOn = (env: Record<string, string>, agent: string) =>
    waitFor(
      `a standby container of ${agent}`,
      async () => {
        const listed = await execa(
          'docker',
          [
            'ps',
            '--format',
            '{{.Names}}',
            '--filter',
            `label=meepagateway.agent=${agent}`,
            '--filter',
            'label=meepagateway.run=standby',
          ],
          {env, reject: false},
        )
        const names = String(listed.stdout).split('\n').filter(Boolean)
        return names.length === 1 && names[0]
      },
      60_000,
    )

  /** Section 5 of docker-bench-security against the one container, through the docker CLI with `env`. */
  const benchOf = async (env: Record<string, string>, container: string, label: string) => {
    const dir = path.join(scratch, label)
    fs.cpSync(BENCH, dir, {recursive: true})
    const ran = await execa(
      'bash',
      ['docker-bench-security.sh', '-b', '-c', 'container_runtime', '-i', container, '-l', path.join(dir, 'out.log')],
      {cwd: dir, env, reject: false, timeout: 120_000},
    )
    expect(ran.exitCode, `${ran.stdout}\n${ran.stderr}`).toBe(0)
    const report = JSON.parse(fs.readFileSync(path.join(dir, 'out.log.json'), 'utf8')) as {
      tests: Array<{results: BenchCheck[]}>
    }
    const checks = report.tests.flatMap((section) => section.results)
    // the run looked at our container (a check that found no container would pass with nothing)
    expect(checks.find((check) => check.id === '5.27')?.items, `${label}: ${ran.stdout}`).toEqual([container])
    return Object.fromEntries(checks.map((check) => [check.id, check]))
  }

  it('gives every check the same result for a run container on both engines, and the hardening checks pass', async () => {
    const tls = engine.tls!
    const certs = path.join(scratch, 'certs')
    fs.mkdirSync(certs)
    fs.copyFileSync(tls.ca, path.join(certs, 'ca.pem'))
    fs.copyFileSync(tls.cert, path.join(certs, 'cert.pem'))
    fs.copyFileSync(tls.key, path.join(certs, 'key.pem'))
    const base = {PATH: process.env.PATH ?? '/usr/bin:/bin', HOME: scratch}
    const remoteEnv = {...base, DOCKER_HOST: tls.host, DOCKER_TLS_VERIFY: '1', DOCKER_CERT_PATH: certs}
    const localEnv = {...base, DOCKER_HOST: localHost}

    const local = await benchOf(localEnv, await standbyOn(localEnv, 'near'), 'local')
    const remote = await benchOf(remoteEnv, await standbyOn(remoteEnv, 'far'), 'remote')

    const results = (checks: Record<string, BenchCheck>) =>
      Object.fromEntries(Object.values(checks).map((check) => [check.id, check.result]))
    expect(Object.keys(local).length).toBeGreaterThanOrEqual(30)
    expect(results(remote)).toEqual(results(local))
    for (const [id, what] of Object.entries(MUST_PASS)) {
      expect(local[id]?.result, `local engine, ${id} (${what}): ${local[id]?.desc}`).toBe('PASS')
      expect(remote[id]?.result, `remote engine, ${id} (${what}): ${remote[id]?.desc}`).toBe('PASS')
    }
  }, 300_000)
})
