import fs from 'node:fs'
import os from 'node:os'
import path from 'node:path'
import {afterAll, beforeAll, describe, expect, it} from 'vitest'
import {DockerCli} from '../../src/sandbox/docker/cli.js'
import {startLyingEngine, type LyingEngine} from '../fakes/lying-engine.js'
import {fakeLlmConfig, makeHome, runCli, type TestHome} from '../helpers/home.js'
import {realDockerPath} from '../helpers/docker-env.js'

/*
 * The operator's registry logins never reach an engine of the `engines:` list. The legacy
 * `docker build` sends the engine every credential the CLI can find (X-Registry-Config): the
 * operator's config.json, the helpers it names, and a platform helper found on PATH when it names
 * none. `container build --engine NAME` through bin/run.js, against an engine of the test's own
 * that records every header it is sent; the local engine (no list, DOCKER_HOST) keeps them.
 */

const FILE_SECRET = 'ghp_FILE_SECRET_4c1d'
const HELPER_SECRET = 'HELPER_SECRET_77ab'
const KEYRING_SECRET = 'KEYRING_SECRET_91fe'
const SECRETS = [FILE_SECRET, HELPER_SECRET, KEYRING_SECRET]

/** Every credential the CLI sent the engine, as it would read them (X-Registry-Config, X-Registry-Auth). */
function sentCredentials(engine: LyingEngine): string[] {
  return engine.received.flatMap(({headers}) =>
    ['x-registry-config', 'x-registry-auth']
      .map((name) => headers[name])
      .filter((value): value is string => typeof value === 'string')
      .map((value) => Buffer.from(value.replace(/-/g, '+').replace(/_/g, '/'), 'base64').toString('utf8')),
  )
}

/** The headers the engine received, raw and base64-decoded: a secret must appear in neither. */
function everythingSent(engine: LyingEngine): string {
  return JSON.stringify(engine.received) + sentCredentials(engine).join('\n')
}

describe.skipIf(!fs.existsSync(realDockerPath()))('registry credentials and the engines they reach', () => {
  let engine: LyingEngine
  let operator: string
  let operatorEnv: Record<string, string>
  const homes: TestHome[] = []

  beforeAll(async () => {
    engine = await startLyingEngine({
      images: {'debian:bookworm-slim': {Id: `sha256:${'b'.repeat(64)}`, Architecture: 'amd64', Os: 'linux'}},
    })
    // the operator's own: two `docker login`s in config.json, one registry through a helper, and a
    // platform keyring helper on PATH (what the CLI asks when a config names no credential at all)
    operator = fs.mkdtempSync(path.join(os.tmpdir(), 'meepa-operator-'))
    const dockerConfig = path.join(operator, '.docker')
    const bin = path.join(operator, 'bin')
    fs.mkdirSync(dockerConfig)
    fs.mkdirSync(bin)
    fs.writeFileSync(
      path.join(dockerConfig, 'config.json'),
      JSON.stringify({
        auths: {
          'ghcr.io': {auth: Buffer.from(`op:${FILE_SECRET}`).toString('base64')},
          'registry.example.com': {username: 'op', password: FILE_SECRET},
        },
        credHelpers: {'helped.example.com': 'meepatest'},
      }),
    )
    const helper = (server: string, secret: string) =>
      `#!/bin/sh\nread -r _ 2>/dev/null\ncase "$1" in\nlist) echo '{"${server}":"op"}' ;;\nget) echo '{"ServerURL":"${server}","Username":"op","Secret":"${secret}"}' ;;\nesac\n`
    fs.writeFileSync(path.join(bin, 'docker-credential-meepatest'), helper('helped.example.com', HELPER_SECRET), {
      mode: 0o755,
    })
    for (const platform of ['pass', 'secretservice'])
      fs.writeFileSync(
        path.join(bin, `docker-credential-${platform}`),
        helper('https://index.docker.io/v1/', KEYRING_SECRET),
        {mode: 0o755},
      )
    operatorEnv = {
      HOME: operator,
      DOCKER_CONFIG: dockerConfig,
      PATH: `${bin}:${path.dirname(realDockerPath())}:${process.env.PATH ?? '/usr/bin:/bin'}`,
    }
  })
  afterAll(async () => {
    await engine?.close()
    for (const home of homes) home.cleanup()
    if (operator) fs.rmSync(operator, {recursive: true, force: true})
  })

  /** A gateway home whose one agent's runs go to `engines` (its `engines:` list), or to the local engine. */
  const home = (engines?: Array<Record<string, unknown>>): TestHome => {
    const containerMode = {enabled: true, network: 'none', ...(engines ? {engines: ['liar']} : {})}
    const made = makeHome(
      fakeLlmConfig('http://127.0.0.1:9/v1', [{id: 'far', container_mode: containerMode}], {
        image_config: {enabled: true},
        ...(engines ? {engines} : {}),
      }),
    )
    homes.push(made)
    engine.requests.length = 0
    engine.received.length = 0
    return made
  }

  it('`container build --engine NAME` sends the engine none of them', async () => {
    const gateway = home([{name: 'liar', host: engine.host}])
    const result = await runCli(['container', 'build', '--engine', 'liar'], {home: gateway.home, env: operatorEnv})
    // the build reached the engine (which refuses it): otherwise nothing here would be proven
    expect(engine.requests, result.stderr + result.stdout).toContain('POST /build')
    expect(result.stdout + result.stderr).toMatch(/this engine builds nothing/)
    const sent = everythingSent(engine)
    for (const secret of SECRETS) expect(sent).not.toContain(secret)
    expect(sent).not.toContain(Buffer.from(`op:${FILE_SECRET}`).toString('base64'))
    for (const credentials of sentCredentials(engine)) {
      for (const entry of Object.values(JSON.parse(credentials) as Record<string, Record<string, string>>))
        expect(entry).not.toHaveProperty('password')
    }
    // the CLI read the gateway's own config, left as it was written, closed to others
    const configDir = path.join(gateway.home, 'cache', 'docker-config')
    const written = JSON.parse(fs.readFileSync(path.join(configDir, 'config.json'), 'utf8')) as Record<string, unknown>
    expect(Object.keys(written).sort()).toEqual(['auths', 'cliPluginsExtraDirs'])
    expect(written.auths).toEqual({'meepagateway.invalid': {}})
    expect(fs.statSync(configDir).mode & 0o777).toBe(0o700)
    // and the operator's is untouched
    expect(fs.readFileSync(path.join(operator, '.docker', 'config.json'), 'utf8')).toContain(FILE_SECRET)
  })

  it('the local engine (no `engines:` list) keeps the operator’s logins, as before', async () => {
    const gateway = home()
    const result = await runCli(['container', 'build'], {
      home: gateway.home,
      env: {...operatorEnv, DOCKER_HOST: engine.host},
    })
    expect(engine.requests, result.stderr + result.stdout).toContain('POST /build')
    const sent = sentCredentials(engine).join('\n')
    expect(sent).toContain(FILE_SECRET)
    expect(sent).toContain(HELPER_SECRET)
    expect(fs.existsSync(path.join(gateway.home, 'cache', 'docker-config'))).toBe(false)
    expect(new DockerCli({baseEnv: operatorEnv}).env().DOCKER_CONFIG).toBe(operatorEnv.DOCKER_CONFIG)
  })
})
