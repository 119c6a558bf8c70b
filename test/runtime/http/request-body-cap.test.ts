import {execa} from 'execa'
import fs from 'node:fs'
import http from 'node:http'
import net from 'node:net'
import path from 'node:path'
import type {ResultPromise} from 'execa'
import {afterAll, beforeAll, describe, expect, it} from 'vitest'
import type {FakeLlm} from '../../fakes/llm-server.js'
import {fakeLlmForTests} from '../../helpers/fake-llm-for-tests.js'
import {freePort} from '../../helpers/free-port.js'
import {fakeLlmConfig, makeHome, runCli, type TestHome} from '../../helpers/home.js'
import {startServeProcess} from '../../helpers/serve-process.js'

const MAX_BODY = 1024 * 1024
const LOGIN_MAX_BODY = 16 * 1024

let llm: FakeLlm
let home: TestHome
let serve: ResultPromise
let base: string
let adminKey: string

fakeLlmForTests((started) => (llm = started))

beforeAll(async () => {
  const port = await freePort()
  home = makeHome(
    fakeLlmConfig(llm.openaiBaseUrl, [{id: 'a1', attachments: {max_total_size: '256k'}}], {
      captain: {enabled: true, bind: '127.0.0.1', port},
    }),
  )
  adminKey = (
    JSON.parse((await runCli(['api-key', 'create', 'ops', '--admin', '--json'], {home: home.home})).stdout) as {
      key: string
    }
  ).key
  const started = await startServeProcess({
    home: home.home,
    configPath: home.configPath,
    env: {MEEPAGATEWAY_PASSWORD: 'request body cap password'},
  })
  serve = started.process
  base = started.url
})

afterAll(async () => {
  serve?.kill('SIGKILL')
  await serve?.catch(() => {})
  home?.cleanup()
})

/** A JSON object of about `bytes` bytes, valid on every route (a wrong field is not what is under test). */
function jsonBody(bytes: number, fields: Record<string, unknown>): Buffer {
  return Buffer.from(JSON.stringify({...fields, padding: 'x'.repeat(bytes)}))
}

interface Answer {
  status: number
  body: string
  /** The server sent `100 Continue` before its answer. */
  continued: boolean
  /** The server closed the connection after the answer, without a reset (the client read the whole answer). */
  closedCleanly: boolean
  ms: number
  trace: string
}

/** curl, as an operator or a script sends a large body: `Expect: 100-continue` unless `expect` is false. */
async function curl(
  method: string,
  route: string,
  body: Buffer,
  options: {expect: boolean; chunked?: boolean; key?: string},
): Promise<Answer> {
  const file = path.join(home.home, `body-${body.length}`)
  fs.writeFileSync(file, body)
  const headers = [
    'content-type: application/json',
    options.expect ? 'expect: 100-continue' : 'expect:',
    ...(options.chunked ? ['transfer-encoding: chunked'] : []),
    ...(options.key ? [`authorization: Bearer ${options.key}`] : []),
  ]
  const started = Date.now()
  const result = await execa(
    'curl',
    [
      '-sS',
      '-v',
      '-m',
      '15',
      '-X',
      method,
      ...headers.flatMap((header) => ['-H', header]),
      '--data-binary',
      `@${file}`,
      '-w',
      '\n%{http_code}',
      base + route,
    ],
    {reject: false},
  )
  const lines = String(result.stdout).split('\n')
  const trace = String(result.stderr)
  return {
    status: Number(lines.pop()),
    body: lines.join('\n'),
    continued: /^< HTTP\/1\.1 100 Continue/m.test(trace),
    // curl says "Closing connection" for a connection the server closed; exit 0: nothing was reset or timed out
    closedCleanly: result.exitCode === 0 && /Closing connection/.test(trace) && !/left intact/.test(trace),
    ms: Date.now() - started,
    trace: `exit ${result.exitCode}\n${trace.slice(-2000)}`,
  }
}

/** Node's http client on a connection of its own; with `expect` the body is sent only on `100 Continue`. */
function nodeRequest(
  method: string,
  route: string,
  body: Buffer,
  options: {expect: boolean; key?: string},
): Promise<Answer> {
  const started = Date.now()
  return new Promise((resolve) => {
    const events: string[] = []
    let answer: Omit<Answer, 'closedCleanly' | 'ms' | 'trace'> = {status: 0, body: '', continued: false}
    let responseEnded = false
    let failed = false
    const req = http.request(base + route, {
      method,
      agent: false,
      headers: {
        'content-type': 'application/json',
        'content-length': String(body.length),
        ...(options.expect ? {expect: '100-continue'} : {}),
        ...(options.key ? {authorization: `Bearer ${options.key}`} : {}),
      },
    })
    const timer = setTimeout(() => {
      events.push('no answer within 15 s')
      req.destroy()
    }, 15_000)
    req.on('continue', () => {
      answer.continued = true
      req.end(body)
    })
    req.on('response', (res) => {
      const chunks: Buffer[] = []
      res.on('data', (chunk: Buffer) => chunks.push(chunk))
      res.on('end', () => {
        responseEnded = true
        answer = {...answer, status: res.statusCode ?? 0, body: Buffer.concat(chunks).toString('utf8')}
      })
    })
    req.on('error', (error) => {
      failed = true
      events.push(`error: ${error.message}`)
    })
    req.on('socket', (socket) => {
      socket.on('close', (hadError) => {
        clearTimeout(timer)
        events.push(`socket closed${hadError ? ' with an error' : ''}`)
        // the response's end may be emitted just after the socket closes
        setImmediate(() =>
          resolve({
            ...answer,
            closedCleanly: responseEnded && !failed && !hadError,
            ms: Date.now() - started,
            trace: events.join('; '),
          }),
        )
      })
    })
    if (!options.expect) req.end(body)
  })
}

/**
 * A client that writes its whole request before it reads a byte of the answer, as Python's
 * http.client and many scripts do: an answer is only of use to it if the server reads (and
 * drops) the rest of the body instead of resetting the connection under it.
 */
function writeAllThenRead(method: string, route: string, body: Buffer, options: {key?: string}): Promise<Answer> {
  const started = Date.now()
  const {hostname, port} = new URL(base)
  return new Promise((resolve) => {
    const events: string[] = []
    const received: Buffer[] = []
    let failed = false
    const socket = net.connect(Number(port), hostname)
    socket.pause()
    const timer = setTimeout(() => {
      events.push('no answer within 15 s')
      socket.destroy()
    }, 15_000)
    const head = [
      `${method} ${route} HTTP/1.1`,
      `host: ${hostname}:${port}`,
      'content-type: application/json',
      `content-length: ${body.length}`,
      ...(options.key ? [`authorization: Bearer ${options.key}`] : []),
      '',
      '',
    ].join('\r\n')
    socket.write(head)
    socket.write(body, (error) => {
      events.push(error ? `writing the body failed: ${error.message}` : 'body written')
      socket.resume()
    })
    socket.on('data', (chunk: Buffer) => received.push(chunk))
    socket.on('error', (error) => {
      failed = true
      events.push(`error: ${error.message}`)
      socket.resume()
    })
    socket.on('close', () => {
      clearTimeout(timer)
      const text = Buffer.concat(received).toString('utf8')
      const status = Number(/^HTTP\/1\.1 (\d{3})/.exec(text)?.[1] ?? 0)
      const answerBody = text.slice(text.indexOf('\r\n\r\n') + 4)
      resolve({
        status,
        body: answerBody,
        continued: false,
        closedCleanly: !failed && status !== 0,
        ms: Date.now() - started,
        trace: events.join('; '),
      })
    })
  })
}

interface OversizedRequest {
  name: string
  method: string
  route: string
  /** The body's fields besides its padding, and its size. */
  fields: Record<string, unknown>
  bytes: number
  /** The route's own cap. */
  limit: number
  admin: boolean
}

const oversized: OversizedRequest[] = [
  {
    name: 'POST /api/chat, 1.5 MB',
    method: 'POST',
    route: '/api/chat',
    fields: {agent: 'a1', message: 'hi'},
    bytes: 1.5 * MAX_BODY,
    // room for the agent's files in base64 (attachments.max_total_size: 256k) beside the 1 MiB
    limit: MAX_BODY + Math.ceil((256 * 1024 * 4) / 3),
    admin: true,
  },
  {
    name: 'PATCH /api/captain/agents/a1, 2 MB',
    method: 'PATCH',
    route: '/api/captain/agents/a1',
    fields: {},
    bytes: 2 * MAX_BODY,
    limit: MAX_BODY,
    admin: true,
  },
  {
    name: 'the login, 2 MB',
    method: 'POST',
    route: '/api/captain/auth/login',
    fields: {password: 'x'},
    bytes: 2 * MAX_BODY,
    limit: LOGIN_MAX_BODY,
    admin: false,
  },
  {
    name: 'the login, 100 KB (over its own 16 KB cap)',
    method: 'POST',
    route: '/api/captain/auth/login',
    fields: {password: 'x'},
    bytes: 100 * 1024,
    limit: LOGIN_MAX_BODY,
    admin: false,
  },
  {
    name: 'POST /api/captain/auth/logout (reads no body), 2 MB',
    method: 'POST',
    route: '/api/captain/auth/logout',
    fields: {},
    bytes: 2 * MAX_BODY,
    limit: MAX_BODY,
    admin: false,
  },
]

interface Client {
  name: string
  /** Sends a Content-Length (not a chunked body). */
  declaresLength: boolean
  expects: boolean
  send(request: OversizedRequest, body: Buffer, key: string | undefined): Promise<Answer>
  /**
   * The body it is tried with: larger than the socket buffers for a client that only reads once it
   * has written it all.
   */
  bytes?(request: OversizedRequest): number
}

const clients: Client[] = [
  {
    name: 'curl with Expect: 100-continue',
    declaresLength: true,
    expects: true,
    send: (r, body, key) => curl(r.method, r.route, body, {expect: true, key}),
  },
  {
    name: 'curl without Expect',
    declaresLength: true,
    expects: false,
    send: (r, body, key) => curl(r.method, r.route, body, {expect: false, key}),
  },
  {
    name: 'curl, chunked (no length), with Expect',
    declaresLength: false,
    expects: true,
    send: (r, body, key) => curl(r.method, r.route, body, {expect: true, chunked: true, key}),
  },
  {
    name: 'curl, chunked (no length), without Expect',
    declaresLength: false,
    expects: false,
    send: (r, body, key) => curl(r.method, r.route, body, {expect: false, chunked: true, key}),
  },
  {
    name: "Node's http client with expect: 100-continue",
    declaresLength: true,
    expects: true,
    send: (r, body, key) => nodeRequest(r.method, r.route, body, {expect: true, key}),
  },
  {
    name: "Node's http client without Expect",
    declaresLength: true,
    expects: false,
    send: (r, body, key) => nodeRequest(r.method, r.route, body, {expect: false, key}),
  },
  {
    name: 'a client that writes the whole body before it reads',
    declaresLength: true,
    expects: false,
    send: (r, body, key) => writeAllThenRead(r.method, r.route, body, {key}),
    bytes: (r) => (r.bytes > MAX_BODY ? 16 * MAX_BODY : r.bytes),
  },
]

describe('request bodies over the cap, against a real `serve`', {timeout: 60_000}, () => {
  for (const request of oversized) {
    it(`${request.name}: 413 naming the cap, then the connection closes cleanly, from every client`, async () => {
      for (const client of clients) {
        const body = jsonBody(client.bytes?.(request) ?? request.bytes, request.fields)
        const answer = await client.send(request, body, request.admin ? adminKey : undefined)
        const what = `${client.name}: ${answer.trace}`
        if (request.route === '/api/captain/auth/logout' && !client.declaresLength) {
          // a route that reads no body cannot know a chunked body's size: it answers, and the rest is read and dropped
          expect(answer.status, what).toBe(200)
          continue
        }
        // a declared length over what the route may read at most (1 MiB, or the web chat's room for
        // files) is refused before the body is read; anything else at the route's own cap
        const early = Math.max(MAX_BODY, request.limit)
        const limit = client.declaresLength && body.length > early ? early : request.limit
        expect(answer.status, what).toBe(413)
        expect(JSON.parse(answer.body), what).toEqual({
          error: {
            code: 'E_INPUT',
            message: `the request body is larger than ${limit} bytes; send at most ${limit} bytes`,
          },
        })
        expect(answer.closedCleanly, what).toBe(true)
        // a declared length over the cap is refused before the client is asked for the body
        if (client.declaresLength && client.expects) expect(answer.continued, what).toBe(false)
        expect(answer.ms, what).toBeLessThan(5_000)
      }
    })
  }

  it('a body within the cap is still asked for with 100 Continue, and answered', async () => {
    const login = await curl('POST', '/api/captain/auth/login', jsonBody(10, {password: 'wrong guess!'}), {
      expect: true,
    })
    expect(login.status, login.trace).toBe(401)
    expect(login.continued, login.trace).toBe(true)
    llm.setDefault({text: 'hello from a1'})
    const chat = await nodeRequest('POST', '/api/chat', Buffer.from(JSON.stringify({agent: 'a1', message: 'hi'})), {
      expect: true,
      key: adminKey,
    })
    expect(chat.continued, chat.trace).toBe(true)
    expect(chat.status, chat.trace).toBe(200)
    expect(JSON.parse(chat.body)).toMatchObject({reply: 'hello from a1'})
    const health = await fetch(`${base}/healthz`)
    expect(health.status).toBe(200)
  })
})
