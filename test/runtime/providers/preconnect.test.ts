import {execa} from 'execa'
import fs from 'node:fs'
import http from 'node:http'
import https from 'node:https'
import type {AddressInfo, Socket} from 'node:net'
import os from 'node:os'
import path from 'node:path'
import {afterEach, describe, expect, it} from 'vitest'
import {httpFetch, preconnect} from '../../../src/runtime/providers/http-fetch.js'
import {createProviderChain} from '../../../src/runtime/providers/index.js'
import {ROOT} from '../../helpers/home.js'
import {selfSignedCertificate} from '../../helpers/self-signed.js'

/*
 * A runner opens its provider's connection while agent-run starts (preconnect), so a `send` does
 * not pay the TCP and TLS handshakes after agent-run asked. Pinned here: the first request uses
 * that connection and is the same request as without it (Host, keep-alive: an outside review
 * found both wrong when the socket bypassed the agent), nothing is sent on it before, a dead one
 * is not used, it keeps no process alive (also when the request cannot be made), an idle
 * keep-alive connection is preferred, and TLS checks the certificate as a request does.
 */

interface Seen {
  connections: Array<{socket: Socket; firstData?: number; accepted: number}>
  requests: number
  headers: http.IncomingHttpHeaders[]
}

const servers: Array<http.Server | https.Server> = []
afterEach(async () => {
  for (const server of servers.splice(0)) {
    server.closeAllConnections()
    await new Promise((resolve) => server.close(resolve))
  }
})

async function listen(
  server: http.Server | https.Server,
  onConnection?: (socket: Socket, index: number) => void,
  port = 0,
): Promise<{origin: string; seen: Seen}> {
  const seen: Seen = {connections: [], requests: 0, headers: []}
  server.on(server instanceof https.Server ? 'secureConnection' : 'connection', (socket: Socket) => {
    const entry: Seen['connections'][number] = {socket, accepted: Date.now()}
    seen.connections.push(entry)
    socket.once('data', () => (entry.firstData ??= Date.now()))
    onConnection?.(socket, seen.connections.length - 1)
  })
  server.on('request', (request: http.IncomingMessage, response: http.ServerResponse) => {
    seen.requests++
    seen.headers.push(request.headers)
    request.resume()
    // each API's smallest answer where the SDKs ask, plain text elsewhere
    const answer = ANSWERS[request.url ?? '']
    request.on('end', () =>
      answer
        ? response.writeHead(200, {'content-type': 'application/json'}).end(JSON.stringify(answer))
        : response.writeHead(200, {'content-type': 'text/plain'}).end('answer'),
    )
  })
  servers.push(server)
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject)
    server.listen(port, '127.0.0.1', resolve)
  })
  const {port: bound} = server.address() as AddressInfo
  const scheme = server instanceof https.Server ? 'https' : 'http'
  // a default port is left out of the origin, as in a base_url such as https://api.openai.com/v1
  return {
    origin: bound === (scheme === 'https' ? 443 : 80) ? `${scheme}://127.0.0.1` : `${scheme}://127.0.0.1:${bound}`,
    seen,
  }
}

async function portFree(port: number): Promise<boolean> {
  const probe = http.createServer()
  return new Promise((resolve) => {
    probe.once('error', () => resolve(false))
    probe.listen(port, '127.0.0.1', () => probe.close(() => resolve(true)))
  })
}

const ANSWERS: Record<string, unknown> = {
  '/v1/chat/completions': {
    id: 'c',
    object: 'chat.completion',
    created: 0,
    model: 'm',
    choices: [{index: 0, message: {role: 'assistant', content: 'hello'}, finish_reason: 'stop'}],
    usage: {prompt_tokens: 1, completion_tokens: 1, total_tokens: 2},
  },
  '/v1/messages': {
    id: 'msg',
    type: 'message',
    role: 'assistant',
    model: 'm',
    content: [{type: 'text', text: 'hello'}],
    stop_reason: 'end_turn',
    stop_sequence: null,
    usage: {input_tokens: 1, output_tokens: 1},
  },
}

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms))
async function until(what: string, check: () => boolean): Promise<void> {
  const deadline = Date.now() + 5000
  while (!check()) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`)
    await sleep(10)
  }
}

describe('preconnect', () => {
  it('the first request goes over the connection opened ahead, on which nothing was sent before it', async () => {
    const {origin, seen} = await listen(http.createServer())
    preconnect(`${origin}/v1`)
    await until('the early connection', () => seen.connections.length === 1)
    await sleep(150)
    expect(seen.connections[0]!.firstData).toBeUndefined()
    const asked = Date.now()
    const response = await httpFetch(`${origin}/v1/echo`, {method: 'POST', body: '{}'})
    expect(await response.text()).toBe('answer')
    expect(seen.connections).toHaveLength(1)
    expect(seen.connections[0]!.accepted).toBeLessThan(asked)
    expect(seen.requests).toBe(1)
  })

  it("the run's second call reuses the connection: the first request on it keeps it alive like any other", async () => {
    const {origin, seen} = await listen(http.createServer({keepAliveTimeout: 10_000}))
    preconnect(origin)
    await until('the early connection', () => seen.connections.length === 1)
    expect(await (await httpFetch(`${origin}/v1/first`, {method: 'POST', body: '{}'})).text()).toBe('answer')
    expect(await (await httpFetch(`${origin}/v1/second`, {method: 'POST', body: '{}'})).text()).toBe('answer')
    expect(seen.headers[0]?.connection).not.toBe('close')
    // each connection is a TCP and TLS handshake with a real provider
    expect(seen.connections).toHaveLength(1)
  })

  it.runIf(process.getuid?.() === 0)(
    'a base_url without a port (http://host): the first request has the Host header it has without preconnect',
    async (context) => {
      if (!(await portFree(80))) return context.skip()
      const {origin, seen} = await listen(http.createServer(), undefined, 80)
      expect(origin).toBe('http://127.0.0.1')
      await (await httpFetch(`${origin}/plain`)).text()
      // the pooled connection expired, as between two messages of a gateway
      for (const {socket} of seen.connections) socket.destroy()
      await sleep(100)
      preconnect(origin)
      await until('the early connection', () => seen.connections.length === 2)
      await (await httpFetch(`${origin}/early`)).text()
      expect(seen.headers.map((headers) => headers.host)).toEqual(['127.0.0.1', '127.0.0.1'])
    },
  )

  it('a request node:http refuses at once (a header value it rejects) leaves no open early connection behind to hold the process', async () => {
    const {origin, seen} = await listen(http.createServer())
    const module = path.join(ROOT, 'dist', 'runtime', 'providers', 'http-fetch.js')
    // a key with a control character: WHATWG Headers takes it, node:http throws ERR_INVALID_CHAR synchronously
    const script = `import {httpFetch, preconnect} from ${JSON.stringify(module)}
      preconnect(${JSON.stringify(origin)}); await new Promise((resolve) => setTimeout(resolve, 200))
      try { await httpFetch(${JSON.stringify(`${origin}/v1/echo`)}, {method: 'POST', body: '{}', headers: {authorization: 'Bearer sk-a\\x7fb'}}) }
      catch (error) { console.log('failed', error.code) }`
    const child = await execa(process.execPath, ['--input-type=module', '-e', script], {timeout: 8000, reject: false})
    expect(child.stdout).toBe('failed ERR_INVALID_CHAR')
    expect(seen.connections).toHaveLength(1)
    expect(child.timedOut).toBe(false)
    expect(child.exitCode).toBe(0)
  })

  it(
    'an answer slower than the idle time (5 s of silence, as an LLM thinking) still arrives on the early connection',
    {timeout: 20_000},
    async () => {
      const server = http.createServer()
      const {origin, seen} = await listen(server)
      server.removeAllListeners('request')
      server.on('request', (request: http.IncomingMessage, response: http.ServerResponse) => {
        request.resume()
        setTimeout(() => response.writeHead(200, {'content-type': 'text/plain'}).end('slow answer'), 6500)
      })
      preconnect(origin)
      await until('the early connection', () => seen.connections.length === 1)
      expect(await (await httpFetch(`${origin}/v1/slow`, {method: 'POST', body: '{}'})).text()).toBe('slow answer')
      expect(seen.connections).toHaveLength(1)
    },
  )

  it('a connection the server closed before the request is not used: the request connects again and succeeds', async () => {
    const {origin, seen} = await listen(http.createServer(), (socket, index) => {
      if (index === 0) socket.destroy()
    })
    preconnect(origin)
    await until('the early connection', () => seen.connections.length === 1)
    await sleep(100)
    const response = await httpFetch(`${origin}/v1/echo`, {method: 'POST', body: '{}'})
    expect(await response.text()).toBe('answer')
    expect(seen.connections).toHaveLength(2)
  })

  it('an idle keep-alive connection (a running gateway) is used, and no second one is opened', async () => {
    const {origin, seen} = await listen(http.createServer({keepAliveTimeout: 10_000}))
    expect(await (await httpFetch(`${origin}/first`)).text()).toBe('answer')
    await sleep(50) // the socket is back in the agent's pool
    preconnect(origin)
    await sleep(100)
    expect(seen.connections).toHaveLength(1)
    expect(await (await httpFetch(`${origin}/second`)).text()).toBe('answer')
    expect(seen.connections).toHaveLength(1)
  })

  for (const kind of ['openai', 'anthropic'] as const) {
    it(`a provider chain's warm-up (${kind}) opens the connection its first call then uses, with no request`, async () => {
      const {origin, seen} = await listen(http.createServer())
      const chain = createProviderChain(
        {
          primary: 'p',
          fallback: [],
          providers: {p: {kind, model: 'm', api_key_env: 'K', base_url: kind === 'openai' ? `${origin}/v1` : origin}},
        } as never,
        {K: 'sk-test'},
      )
      chain.warm()
      await until('the early connection', () => seen.connections.length === 1)
      expect(seen.requests).toBe(0)
      const response = await chain.chat({system: 's', messages: [{role: 'user', content: 'hi'}], tools: []})
      expect(response.content).toBe('hello')
      expect(seen.connections).toHaveLength(1)
    })
  }

  it('an unused early connection does not keep a process alive (a run that failed before asking)', async () => {
    const {origin, seen} = await listen(http.createServer())
    const module = path.join(ROOT, 'dist', 'runtime', 'providers', 'http-fetch.js')
    const started = Date.now()
    const child = await execa(
      process.execPath,
      [
        '--input-type=module',
        '-e',
        `import {preconnect} from ${JSON.stringify(module)}; preconnect(${JSON.stringify(origin)}); setTimeout(() => {}, 300)`,
      ],
      {timeout: 10_000, reject: false},
    )
    expect(child.exitCode).toBe(0)
    expect(Date.now() - started).toBeLessThan(5000)
    expect(seen.connections).toHaveLength(1)
  })
})

describe.runIf(fs.existsSync('/usr/bin/openssl'))('preconnect over TLS', () => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'meepa-preconnect-'))
  const cert = path.join(dir, 'cert.pem')
  const key = path.join(dir, 'key.pem')
  const client = (origin: string, early: boolean) =>
    `import {httpFetch, preconnect} from ${JSON.stringify(path.join(ROOT, 'dist', 'runtime', 'providers', 'http-fetch.js'))}
    ${early ? `preconnect(${JSON.stringify(origin)}); await new Promise((resolve) => setTimeout(resolve, 200))` : ''}
    try { const response = await httpFetch(${JSON.stringify(`${origin}/v1/echo`)}, {method: 'POST', body: '{}'}); console.log('status', response.status, await response.text()) }
    catch (error) { console.log('error', error.code) }`

  async function tlsServer() {
    await selfSignedCertificate(cert, key)
    return listen(https.createServer({cert: fs.readFileSync(cert), key: fs.readFileSync(key)}))
  }

  it('the early TLS connection serves the first request when the certificate is trusted', async () => {
    const {origin, seen} = await tlsServer()
    const result = await execa(process.execPath, ['--input-type=module', '-e', client(origin, true)], {
      env: {NODE_EXTRA_CA_CERTS: cert},
      timeout: 10_000,
    })
    expect(result.stdout).toBe('status 200 answer')
    expect(seen.connections).toHaveLength(1)
  })

  it.runIf(process.getuid?.() === 0)(
    'an https base_url without a port (https://api.openai.com/v1): the first request says Host: <host>, not <host>:80',
    async (context) => {
      if (!(await portFree(443))) return context.skip()
      const named = path.join(dir, 'localhost.pem')
      const namedKey = path.join(dir, 'localhost-key.pem')
      await selfSignedCertificate(named, namedKey, 'localhost')
      const {seen} = await listen(
        https.createServer({cert: fs.readFileSync(named), key: fs.readFileSync(namedKey)}),
        undefined,
        443,
      )
      const result = await execa(process.execPath, ['--input-type=module', '-e', client('https://localhost', true)], {
        env: {NODE_EXTRA_CA_CERTS: named},
        timeout: 10_000,
      })
      expect(result.stdout).toBe('status 200 answer')
      expect(seen.connections).toHaveLength(1)
      expect(seen.headers[0]?.host).toBe('localhost')
    },
  )

  it('an untrusted certificate fails the request exactly as without it: the early connection checks it too', async () => {
    const {origin, seen} = await tlsServer()
    const env = {NODE_EXTRA_CA_CERTS: ''}
    const without = await execa(process.execPath, ['--input-type=module', '-e', client(origin, false)], {
      env,
      timeout: 10_000,
    })
    const withEarly = await execa(process.execPath, ['--input-type=module', '-e', client(origin, true)], {
      env,
      timeout: 10_000,
    })
    expect(without.stdout).toMatch(/^error [A-Z_]+$/)
    expect(withEarly.stdout).toBe(without.stdout)
    expect(seen.requests).toBe(0)
  })
})
