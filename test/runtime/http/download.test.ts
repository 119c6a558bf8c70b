import {createServer, type Server} from 'node:http'
import {afterEach, describe, expect, it} from 'vitest'
import {downloadFile, DownloadRefused, isPublicAddress, type AllowedOrigin} from '../../../src/runtime/http/download.js'
import {createFakeFiles, type FakeFiles} from '../../fakes/fake-files.js'
import {closeFakeServer, listenOnLoopback} from '../../fakes/fake-http.js'

const servers: Server[] = []
afterEach(async () => {
  for (const server of servers.splice(0)) await closeFakeServer(server)
})

/** A file server on 127.0.0.1 that wants `Bearer good` and records what it was asked. */
async function fileServer(): Promise<{files: FakeFiles; origin: string; port: number}> {
  const files = createFakeFiles()
  const server = createServer((req, res) => {
    if (!files.serve(req, res, req.headers.authorization === 'Bearer good')) res.writeHead(404).end()
  })
  servers.push(server)
  const port = await listenOnLoopback(server)
  return {files, origin: `http://127.0.0.1:${port}`, port}
}

async function fetchAll(
  url: string,
  allowed: AllowedOrigin[],
  options: Partial<Parameters<typeof downloadFile>[1]> = {},
) {
  const chunks: Buffer[] = []
  for await (const chunk of downloadFile(url, {allowed, maxBytes: 1024 * 1024, ...options})) chunks.push(chunk)
  return Buffer.concat(chunks)
}

async function refusal(promise: Promise<unknown>): Promise<DownloadRefused> {
  const error = await promise.then(
    () => undefined,
    (caught: unknown) => caught,
  )
  expect(error).toBeInstanceOf(DownloadRefused)
  return error as DownloadRefused
}

describe('downloadFile: only the connector origin, within the caps', () => {
  it('fetches from the allowed origin with its credential', async () => {
    const {files, origin} = await fileServer()
    files.add('/a.txt', {body: Buffer.from('hello')})
    const body = await fetchAll(`${origin}/a.txt`, [
      {origin, publicOnly: false, headers: {authorization: 'Bearer good'}},
    ])
    expect(body.toString()).toBe('hello')
    expect(files.downloads).toEqual([{path: '/a.txt', authorization: 'Bearer good'}])
  })

  it('refuses another port of the same host, another host, metadata and loopback addresses, other schemes', async () => {
    const {files, origin} = await fileServer()
    const other = await fileServer()
    other.files.add('/a.txt', {body: Buffer.from('secret')})
    const allowed = [{origin, publicOnly: false, headers: {authorization: 'Bearer good'}}]
    for (const url of [
      `${other.origin}/a.txt`,
      'http://169.254.169.254/latest/meta-data/',
      'http://localhost/a.txt',
      `http://[::1]:${other.port}/a.txt`,
      'file:///etc/passwd',
      `http://user:pw@${origin.slice(7)}/a.txt`,
      'not a url',
    ]) {
      const error = await refusal(fetchAll(url, allowed))
      expect(error.kind, url).toBe('origin')
    }
    expect(other.files.downloads).toEqual([])
    expect(files.downloads).toEqual([])
  })

  it('refuses a platform host at a private or metadata address, literal or resolved', async () => {
    const {files, port} = await fileServer()
    files.add('/a.txt', {body: Buffer.from('x')})
    const literal = await refusal(
      fetchAll(`http://127.0.0.1:${port}/a.txt`, [{origin: `http://127.0.0.1:${port}`, publicOnly: true}]),
    )
    expect(literal.kind).toBe('address')
    // files.example resolves to loopback (as a rebinding DNS answer would): refused at connect
    const lookup = ((_host: string, _options: unknown, callback: (...args: unknown[]) => void) =>
      callback(null, [{address: '127.0.0.1', family: 4}])) as never
    const resolved = await refusal(
      fetchAll(`http://files.example:${port}/a.txt`, [{origin: `http://files.example:${port}`, publicOnly: true}], {
        lookup,
      }),
    )
    expect(resolved.kind).toBe('address')
    expect(resolved.reason).toContain('127.0.0.1')
    expect(files.downloads).toEqual([])
    for (const address of [
      '10.1.2.3',
      '172.20.0.1',
      '192.168.1.1',
      '169.254.169.254',
      '100.64.0.1',
      '::1',
      'fe80::1',
      'fd00::1',
      '::ffff:127.0.0.1',
      '0.0.0.0',
    ])
      expect(isPublicAddress(address), address).toBe(false)
    for (const address of ['1.1.1.1', '151.101.1.1', '2606:4700::1111'])
      expect(isPublicAddress(address), address).toBe(true)
  })

  it('re-checks every redirect, drops nothing it should not send, and stops after the limit', async () => {
    const {files, origin} = await fileServer()
    const other = await fileServer()
    other.files.add('/loot', {body: Buffer.from('secret')})
    files.add('/away', {redirect: `${other.origin}/loot`})
    files.add('/metadata', {redirect: 'http://169.254.169.254/latest/meta-data/'})
    files.add('/here', {redirect: '/a.txt'})
    files.add('/a.txt', {body: Buffer.from('moved')})
    files.add('/loop', {redirect: '/loop'})
    const allowed = [{origin, publicOnly: false, headers: {authorization: 'Bearer good'}}]
    expect((await refusal(fetchAll(`${origin}/away`, allowed))).kind).toBe('origin')
    expect((await refusal(fetchAll(`${origin}/metadata`, allowed))).kind).toBe('origin')
    expect(other.files.downloads).toEqual([])
    expect((await fetchAll(`${origin}/here`, allowed)).toString()).toBe('moved')
    const loop = await refusal(fetchAll(`${origin}/loop`, allowed, {maxRedirects: 3}))
    expect(loop.kind).toBe('redirects')
    expect(files.downloads.filter((download) => download.path === '/loop')).toHaveLength(4)
  })

  it('stops at the cap: a declared length over it, an endless body, and says an HTTP error', async () => {
    const {files, origin} = await fileServer()
    files.add('/big', {body: Buffer.alloc(5000)})
    files.add('/endless', {endless: true})
    files.add('/gone', {status: 404})
    const allowed = [{origin, publicOnly: false, headers: {authorization: 'Bearer good'}}]
    expect((await refusal(fetchAll(`${origin}/big`, allowed, {maxBytes: 4096}))).kind).toBe('too-large')
    const started = Date.now()
    expect((await refusal(fetchAll(`${origin}/endless`, allowed, {maxBytes: 1024 * 1024}))).kind).toBe('too-large')
    expect(Date.now() - started).toBeLessThan(5000)
    const gone = await refusal(fetchAll(`${origin}/gone`, allowed))
    expect([gone.kind, gone.status]).toEqual(['http', 404])
    expect((await refusal(fetchAll(`${origin}/big`, [{origin, publicOnly: false}]))).status).toBe(401)
  })

  it('gives up on a server that does not answer, and on one too slow overall', async () => {
    const {files, origin} = await fileServer()
    files.add('/slow', {body: Buffer.from('late'), delayMs: 2000})
    const allowed = [{origin, publicOnly: false, headers: {authorization: 'Bearer good'}}]
    const idle = await refusal(fetchAll(`${origin}/slow`, allowed, {idleTimeoutMs: 200}))
    expect(idle.kind).toBe('timeout')
    files.add('/endless', {endless: true})
    const total = await refusal(fetchAll(`${origin}/endless`, allowed, {maxBytes: 10 ** 12, totalTimeoutMs: 300}))
    expect(total.kind).toBe('timeout')
  })
})
