import fs from 'node:fs'
import net from 'node:net'
import os from 'node:os'
import path from 'node:path'
import {afterEach, describe, expect, it} from 'vitest'
import {Router} from '../../../src/runtime/http/router.js'
import {startHttpListener, type HttpListener} from '../../../src/runtime/http/server.js'
import {AuditLog} from '../../../src/runtime/state/audit.js'
import {MAX_STREAMS_PER_PRINCIPAL, StreamLimiter} from '../../../src/runtime/captain/sse.js'
import {DockerCli} from '../../../src/sandbox/docker/cli.js'
import {captainConfig, sessionHeaders, startCaptain, type CaptainHarness} from './helpers.js'

/** A `docker` that only writes down how it was called: proves no call was made with a bad reference. */
function recordingDocker(): {cli: DockerCli; calls: () => string[][]; cleanup(): void} {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'meepa-docker-'))
  const log = path.join(dir, 'calls.jsonl')
  const bin = path.join(dir, 'docker')
  fs.writeFileSync(
    bin,
    `#!/usr/bin/env node\nrequire('fs').appendFileSync(${JSON.stringify(log)}, JSON.stringify(process.argv.slice(2)) + '\\n')\nprocess.stderr.write('Error: No such image\\n')\nprocess.exit(1)\n`,
    {mode: 0o755},
  )
  return {
    cli: new DockerCli({bin}),
    calls: () =>
      fs.existsSync(log)
        ? fs
            .readFileSync(log, 'utf8')
            .trim()
            .split('\n')
            .map((line) => JSON.parse(line) as string[])
        : [],
    cleanup: () => fs.rmSync(dir, {recursive: true, force: true}),
  }
}

describe('control plane attacks', () => {
  let harness: CaptainHarness | undefined
  afterEach(async () => {
    await harness?.close()
    harness = undefined
  })

  it('audits every API config change (old → new, who), and a weakening at warning level in the log too', async () => {
    harness = await startCaptain()
    const headers = sessionHeaders(await harness.login())
    expect(
      (await harness.request('PATCH', '/api/captain/agents/meepa', {body: {max_iterations: 9}, headers})).status,
    ).toBe(200)
    expect(
      (
        await harness.request('PATCH', '/api/captain/agents/meepa', {
          body: {file_access: {unrestricted: true}},
          headers,
        })
      ).status,
    ).toBe(200)
    expect(
      (
        await harness.request('PATCH', '/api/captain/agents/meepa', {
          body: {file_access: {unrestricted: false, allow_network: false}},
          headers,
        })
      ).status,
    ).toBe(200)
    expect(
      (
        await harness.request('PATCH', '/api/captain/agents/meepa', {
          body: {file_access: {allow_network: true, allow_read: ['/srv/data']}},
          headers,
        })
      ).status,
    ).toBe(200)
    expect(
      (
        await harness.request('PATCH', '/api/captain/agents/meepa', {
          body: {container_mode: {enabled: true, network: 'host'}},
          headers,
        })
      ).status,
    ).toBe(200)
    expect(
      (
        await harness.request('PUT', '/api/captain/container/config', {
          body: {
            base_image: 'debian:bookworm-slim',
            redact_secrets: false,
            env_vars: {DEPLOY_TOKEN: 'tok-baked-into-image'},
          },
          headers,
        })
      ).status,
    ).toBe(200)
    const entries = new AuditLog(harness.db).list().filter((entry) => entry.event === 'config_change')
    expect(entries.map((entry) => entry.level)).toEqual(['info', 'warning', 'info', 'warning', 'warning', 'warning'])
    expect(entries.every((entry) => entry.principal === 'dashboard' && entry.source === '127.0.0.1')).toBe(true)
    expect(entries[0]!.summary).toBe('agent meepa changed: max_iterations: null → 9')
    expect(entries[1]!.summary).toMatch(/isolation host-sandbox → unrestricted/)
    expect(entries[3]!.summary).toMatch(/WEAKENS ISOLATION: .*file_access\.allow_read widened by \/srv\/data/)
    expect(entries[3]!.summary).toMatch(/WEAKENS ISOLATION: .*file_access\.allow_network on/)
    expect(entries[4]!.summary).toMatch(/container_mode\.network bridge → host/)
    expect(entries[5]!.summary).toMatch(/redact_secrets off/)
    expect(entries[5]!.details!.changes).toEqual(
      expect.arrayContaining([{field: 'redact_secrets', old: null, new: false}]),
    )
    expect(entries[5]!.summary).toContain('"DEPLOY_TOKEN":"(20 characters)"')
    expect(JSON.stringify(entries) + harness.logs.join('\n')).not.toContain('tok-baked-into-image')
    const logged = harness.logs.filter((line) => line.startsWith('audit WARNING:'))
    expect(logged).toHaveLength(4)
    expect(logged[0]).toContain('(by dashboard from 127.0.0.1)')
  })

  it('container user "0", allow_listen, another image, image packages and env_vars are audited as warnings', async () => {
    harness = await startCaptain()
    const headers = sessionHeaders(await harness.login())
    for (const container_mode of [{user: '0'}, {image: 'someone/else:latest'}]) {
      expect(
        (await harness.request('PATCH', '/api/captain/agents/meepa', {body: {container_mode}, headers})).status,
      ).toBe(200)
    }
    expect(
      (
        await harness.request('PATCH', '/api/captain/agents/meepa', {
          body: {file_access: {allow_listen: true}},
          headers,
        })
      ).status,
    ).toBe(200)
    expect(
      (
        await harness.request('PUT', '/api/captain/container/config', {
          body: {base_image: 'debian:bookworm-slim', packages: ['sudo'], env_vars: {LD_PRELOAD: '/x.so'}},
          headers,
        })
      ).status,
    ).toBe(200)
    expect(
      (await harness.request('PATCH', '/api/captain/agents/meepa', {body: {name: 'Renamed'}, headers})).status,
    ).toBe(200)
    const entries = new AuditLog(harness.db).list().filter((entry) => entry.event === 'config_change')
    expect(entries.map((entry) => [entry.level, entry.details?.weakenings])).toEqual([
      ['warning', ['container_mode.user unset → 0']],
      ['warning', ['container_mode.image unset → someone/else:latest']],
      ['warning', ['file_access.allow_listen on']],
      ['warning', ['packages widened by sudo', 'env_vars widened by LD_PRELOAD']],
      ['info', []],
    ])
    expect(harness.logs.filter((line) => line.startsWith('audit WARNING:'))).toHaveLength(4)
  })

  it('refuses "$" values through the API (400 naming the field) and shows references as written, never resolved', async () => {
    harness = await startCaptain({
      config: captainConfig([{id: 'meepa', name: '$AGENT_NAME'}]).replace(
        'packages: []',
        'packages: []\n  env_vars: {TOKEN: $SOME_TOKEN}',
      ),
      env: {AGENT_NAME: 'resolved-name-value', SOME_TOKEN: 'sk-some-token-value'},
    })
    const headers = sessionHeaders(await harness.login())
    for (const [method, url, body, field] of [
      ['PATCH', '/api/captain/agents/meepa', {name: '$MEEPAGATEWAY_PASSWORD'}, 'agents[0].name'],
      ['PATCH', '/api/captain/agents/meepa', {model: '${FAKE_LLM_KEY}'}, 'agents[0].model'],
      [
        'PATCH',
        '/api/captain/agents/meepa',
        {file_access: {allow_read: ['$HOME']}},
        'agents[0].file_access.allow_read[0]',
      ],
      [
        'PUT',
        '/api/captain/container/config',
        {base_image: 'debian:bookworm-slim', env_vars: {X: '$FAKE_LLM_KEY'}},
        'image_config.env_vars.X',
      ],
    ] as const) {
      const res = await harness.request(method, url, {body, headers})
      expect(res.status).toBe(400)
      expect(res.body.error.message).toContain(field)
    }
    const shown = JSON.stringify([
      (await harness.request('GET', '/api/captain/agents', {headers})).body,
      (await harness.request('GET', '/api/captain/agents/meepa', {headers})).body,
      (await harness.request('GET', '/api/captain/container/config', {headers})).body,
      (await harness.request('GET', '/api/captain/container/dockerfile', {headers})).body,
      (await harness.request('PATCH', '/api/captain/agents/meepa', {body: {max_iterations: 3}, headers})).body,
    ])
    expect(shown).toContain('$AGENT_NAME')
    expect(shown).not.toContain('resolved-name-value')
    expect(shown).not.toContain('sk-some-token-value')
    expect(shown).not.toContain('sk-test') // FAKE_LLM_KEY
    const dockerfile = (await harness.request('GET', '/api/captain/container/dockerfile', {headers})).body
      .dockerfile as string
    expect(dockerfile).toContain('ENV TOKEN="\\$SOME_TOKEN"') // a literal, never expanded by the builder either
  })

  it('one audit entry is one log line: a key name with a line break cannot forge another entry', async () => {
    harness = await startCaptain()
    const headers = sessionHeaders(await harness.login())
    const forged = 'x)\n2026-01-01T00:00:00.000Z audit: nothing happened (by cli'
    const refused = await harness.request('POST', '/api/captain/auth/api-keys', {
      body: {name: forged, admin: true},
      headers,
    })
    expect(refused.status).toBe(400)
    expect(refused.body.error.message).toContain('without control characters')
    // a name already stored by an older gateway still prints on one line
    new AuditLog(harness.db, (line) => harness!.logs.push(line)).record({
      event: 'config_change',
      principal: `admin key key_0 (${forged})`,
      summary: 'agent a1 changed',
    })
    const line = harness.logs.at(-1) as string
    expect(line).not.toContain('\n')
    expect(line).toContain('x)\\n2026-01-01')
  })

  it('shows references from agent_defaults and the provider section as written too, never resolved', async () => {
    const config = captainConfig([{id: 'meepa'}, {id: 'boxed', file_access: {deny: ['/srv']}}])
      .replace('model: fake-model', 'model: $SECRET_MODEL')
      .replace(
        'agents:',
        'agent_defaults:\n  file_access: {allow_read: [$SECRET_PATH], deny: [$SECRET_DENY]}\n  container_mode: {image: $SECRET_IMAGE}\nagents:',
      )
    harness = await startCaptain({
      config,
      env: {
        SECRET_MODEL: 'model-from-env-value',
        SECRET_PATH: '/srv/path-from-env-value',
        SECRET_DENY: '/srv/deny-from-env-value',
        SECRET_IMAGE: 'image-from-env-value:1',
      },
    })
    const headers = sessionHeaders(await harness.login())
    const shown = JSON.stringify([
      (await harness.request('GET', '/api/captain/agents', {headers})).body,
      (await harness.request('GET', '/api/captain/agents/meepa', {headers})).body,
      (await harness.request('GET', '/api/captain/agents/boxed', {headers})).body,
      (await harness.request('PATCH', '/api/captain/agents/meepa', {body: {max_iterations: 3}, headers})).body,
    ])
    expect(shown).not.toContain('from-env-value')
    expect(shown).toContain('$SECRET_MODEL')
    expect(shown).toContain('$SECRET_PATH')
    expect(shown).toContain('$SECRET_IMAGE')
    const boxed = (await harness.request('GET', '/api/captain/agents/boxed', {headers})).body
    // the agent's own list wins, as when loading
    expect(boxed.file_access).toMatchObject({allow_read: ['$SECRET_PATH'], deny: ['/srv']})
  })

  it('refuses docker references that are flags or not references before any docker call', async () => {
    const docker = recordingDocker()
    try {
      harness = await startCaptain({docker: docker.cli})
      const headers = sessionHeaders(await harness.login())
      for (const ref of ['--help', '-v', '--output=/tmp/x', 'a b', 'debian:-latest', 'x@sha256:zz']) {
        const draft = encodeURIComponent(JSON.stringify({base_image: ref, packages: ['jq']}))
        const preview = await harness.request('GET', `/api/captain/container/dockerfile?draft=${draft}`, {headers})
        expect(preview.status, ref).toBe(400)
        expect(preview.body.error.message).toContain('is not a Docker image reference')
        const saved = await harness.request('PUT', '/api/captain/container/config', {body: {base_image: ref}, headers})
        expect(saved.status, ref).toBe(400)
        const agent = await harness.request('PATCH', '/api/captain/agents/meepa', {
          body: {container_mode: {image: ref}},
          headers,
        })
        expect(agent.status, ref).toBe(400)
      }
      expect(
        (
          await harness.request(
            'DELETE',
            `/api/captain/container/images/${encodeURIComponent('meepa-sandbox:--help')}`,
            {headers},
          )
        ).status,
      ).toBe(400)
      expect(
        docker
          .calls()
          .flat()
          .filter(
            (arg) =>
              arg.startsWith('-') &&
              !['--format', '--rm', '--pull', '--network', '--log-driver', '--label', '--entrypoint'].includes(arg),
          ),
      ).toEqual([])
      expect(docker.calls().flat()).not.toContain('--help')
    } finally {
      docker.cleanup()
    }
  })

  it('answers malformed, mistyped and deeply nested JSON with 400, never 500', async () => {
    harness = await startCaptain()
    const headers = {...sessionHeaders(await harness.login()), 'content-type': 'application/json'}
    const send = (body: string) => fetch(`${harness!.url}/api/captain/agents/meepa`, {method: 'PATCH', headers, body})
    const deep = '{"file_access":' + '{"a":'.repeat(5000) + '1' + '}'.repeat(5000) + '}'
    const deepArray = '{"name":' + '['.repeat(100_000) + ']'.repeat(100_000) + '}'
    for (const body of [
      '{"name":{"a":1}}',
      '{"name":[1]}',
      '{"max_iterations":{"x":{}}}',
      '{oops',
      deep,
      deepArray,
      '[]',
      'null',
    ]) {
      const res = await send(body)
      expect(res.status, body.slice(0, 40)).toBe(400)
    }
    expect(harness.logs.filter((line) => line.includes('failed'))).toEqual([])
  })
})

describe('HTTP listener protections', () => {
  let listener: HttpListener | undefined
  afterEach(async () => {
    await listener?.close()
    listener = undefined
  })

  const rawRequest = (port: number, text: string) =>
    new Promise<string>((resolve, reject) => {
      const socket = net.connect(port, '127.0.0.1', () => socket.write(text))
      let data = ''
      socket.on('data', (chunk) => (data += chunk.toString()))
      socket.on('end', () => resolve(data))
      socket.on('close', () => resolve(data))
      socket.on('error', reject)
    })

  it('answers 421 to a Host that is not loopback or allowed, before any handler runs (DNS rebinding)', async () => {
    let handled = 0
    const router = new Router().get('/api/captain/auth/session', ({res}) => {
      handled++
      res.end('{}')
    })
    listener = await startHttpListener({
      bind: '127.0.0.1',
      port: 0,
      router,
      log: () => {},
      allowedHosts: () => ['gateway.lan'],
    })
    const answer = (host: string) =>
      rawRequest(listener!.port, `GET /api/captain/auth/session HTTP/1.1\r\nHost: ${host}\r\nConnection: close\r\n\r\n`)
    for (const host of [
      'evil.example',
      'evil.example:63372',
      '127.0.0.1.nip.io',
      'localhost.evil.example',
      '10.0.0.5',
    ]) {
      expect(await answer(host), host).toMatch(/^HTTP\/1\.1 421 /)
    }
    expect(await rawRequest(listener.port, 'GET /api/captain/auth/session HTTP/1.0\r\n\r\n')).toMatch(
      /^HTTP\/1\.1 421 /,
    )
    expect(handled).toBe(0)
    for (const host of [
      `127.0.0.1:${listener.port}`,
      'localhost',
      `[::1]:${listener.port}`,
      '127.0.0.2',
      'gateway.lan',
      'GATEWAY.lan:8080',
    ]) {
      expect(await answer(host), host).toMatch(/^HTTP\/1\.1 200 /)
    }
  })

  it('reads Host strictly: junk after a bracketed address, an absolute-form target naming another host, or two Host headers get 421', async () => {
    let handled = 0
    const router = new Router().get('/api/captain/auth/session', ({res}) => {
      handled++
      res.end('{}')
    })
    listener = await startHttpListener({bind: '127.0.0.1', port: 0, router, log: () => {}})
    const request = (target: string, hosts: string[]) =>
      rawRequest(
        listener!.port,
        `GET ${target} HTTP/1.1\r\n${hosts.map((host) => `Host: ${host}\r\n`).join('')}Connection: close\r\n\r\n`,
      )
    for (const host of [
      '[::1].evil.example',
      '[::1]evil.example',
      '[::1]:80.evil.example',
      '[::1]:',
      'localhost:',
      '127.0.0.1:80:80',
    ]) {
      expect(await request('/api/captain/auth/session', [host]), host).toMatch(/^HTTP\/1\.1 421 /)
    }
    expect(await request('http://evil.example/api/captain/auth/session', ['127.0.0.1'])).toMatch(/^HTTP\/1\.1 421 /)
    expect(await request('/api/captain/auth/session', ['127.0.0.1', 'evil.example'])).toMatch(/^HTTP\/1\.1 421 /)
    expect(await request('/api/captain/auth/session', ['127.0.0.1', '127.0.0.1'])).toMatch(/^HTTP\/1\.1 421 /)
    expect(handled).toBe(0)
    expect(await request(`http://127.0.0.1:${listener.port}/api/captain/auth/session`, ['localhost'])).toMatch(
      /^HTTP\/1\.1 200 /,
    )
    expect(await request('/api/captain/auth/session', ['[::1]'])).toMatch(/^HTTP\/1\.1 200 /)
  })

  it('drops a request whose body has not arrived in time, while a slow reply to a whole request still arrives', async () => {
    const router = new Router()
      .post('/slow-body', async ({req, res}) => {
        for await (const _ of req) {
          // reading what dribbles in
        }
        res.end('done')
      })
      .post('/long-run', async ({req, res}) => {
        for await (const _ of req) {
          // whole body first
        }
        await new Promise((resolve) => setTimeout(resolve, 2500))
        res.end('reply after the timeout')
      })
    const logs: string[] = []
    listener = await startHttpListener({
      bind: '127.0.0.1',
      port: 0,
      router,
      log: (line) => logs.push(line),
      requestTimeoutMs: 1000,
    })
    const started = Date.now()
    const socket = net.connect(listener.port, '127.0.0.1')
    socket.on('error', () => {}) // the server hangs up on it: that is the point
    await new Promise((resolve) => socket.once('connect', resolve))
    socket.write(
      'POST /slow-body HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{',
    )
    const trickle = setInterval(() => socket.writable && socket.write(' '), 200)
    const closed = await new Promise<number>((resolve) => socket.once('close', () => resolve(Date.now() - started)))
    clearInterval(trickle)
    expect(closed).toBeLessThan(4000)
    const long = await fetch(`${listener.url}/long-run`, {method: 'POST', body: 'x'})
    expect(long.status).toBe(200)
    expect(await long.text()).toBe('reply after the timeout')
  })

  it('caps concurrent event streams per principal', async () => {
    const streams = new StreamLimiter(MAX_STREAMS_PER_PRINCIPAL)
    const router = new Router().get('/events', async ({req, res, url}) => {
      const stream = streams.open(url.searchParams.get('who') as string, req, res)
      stream.send('hello', {})
      await stream.closed
    })
    listener = await startHttpListener({bind: '127.0.0.1', port: 0, router, log: () => {}})
    const open = async (who: string) => {
      const controller = new AbortController()
      const res = await fetch(`${listener!.url}/events?who=${who}`, {signal: controller.signal})
      return {status: res.status, close: () => controller.abort()}
    }
    const held = await Promise.all(Array.from({length: MAX_STREAMS_PER_PRINCIPAL}, () => open('agent-key')))
    expect(held.map((stream) => stream.status)).toEqual(Array(MAX_STREAMS_PER_PRINCIPAL).fill(200))
    const refused = await open('agent-key')
    expect(refused.status).toBe(429)
    const other = await open('dashboard')
    expect(other.status).toBe(200) // another principal is not starved
    held[0]!.close()
    await new Promise((resolve) => setTimeout(resolve, 200))
    const again = await open('agent-key')
    expect(again.status).toBe(200)
    for (const stream of [...held, other, again]) stream.close()
  })

  it('rate-limits the log lines of aborted requests', async () => {
    const router = new Router().post('/upload', async ({req, res}) => {
      for await (const _ of req) {
        // the client goes away mid-body
      }
      res.end('ok')
    })
    const logs: string[] = []
    listener = await startHttpListener({bind: '127.0.0.1', port: 0, router, log: (line) => logs.push(line)})
    for (let index = 0; index < 40; index++) {
      const socket = net.connect(listener.port, '127.0.0.1')
      await new Promise((resolve) => socket.once('connect', resolve))
      socket.write('POST /upload HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 1000\r\n\r\npartial')
      await new Promise((resolve) => setTimeout(resolve, 5))
      socket.destroy()
    }
    await new Promise((resolve) => setTimeout(resolve, 300))
    expect(logs.length).toBeGreaterThan(0)
    expect(logs.length).toBeLessThanOrEqual(10)
  })
})
