import http from 'node:http'
import type {AddressInfo} from 'node:net'
import zlib from 'node:zlib'
import {afterAll, beforeAll, describe, expect, it} from 'vitest'
import {httpFetch} from '../../../src/runtime/providers/http-fetch.js'
import {freePort} from '../../helpers/free-port.js'

/*
 * The fetch both SDKs are given in agent-run. The provider tests drive it through the real SDKs
 * (streaming, retries, errors); these pin the edges an SDK relies on without showing it.
 */
describe('httpFetch', () => {
  let server: http.Server
  let base: string
  const seen: Array<{method: string; url: string; headers: http.IncomingHttpHeaders; body: string}> = []
  let streamClosed: Promise<void> = Promise.resolve()

  beforeAll(async () => {
    server = http.createServer((req, res) => {
      const chunks: Buffer[] = []
      req.on('data', (chunk: Buffer) => chunks.push(chunk))
      req.on('end', () => {
        seen.push({
          method: req.method ?? '',
          url: req.url ?? '',
          headers: req.headers,
          body: Buffer.concat(chunks).toString('utf8'),
        })
        switch (req.url) {
          case '/gzip':
            res.writeHead(200, {'content-type': 'application/json', 'content-encoding': 'gzip'})
            res.end(zlib.gzipSync(JSON.stringify({hello: 'world'})))
            return
          case '/empty':
            res.writeHead(204, [
              ['x-request-id', 'req_1'],
              ['set-cookie', 'a=1'],
              ['set-cookie', 'b=2'],
            ])
            res.end()
            return
          case '/redirect':
            res.writeHead(302, {location: 'http://127.0.0.1:1/elsewhere'})
            res.end()
            return
          case '/stream':
            res.writeHead(200, {'content-type': 'text/event-stream'})
            res.write('data: first\n\n')
            // never ends on its own: the client has to abort
            streamClosed = new Promise((resolve) => res.on('close', resolve))
            return
          default:
            res.writeHead(200, {'content-type': 'text/plain'})
            res.end(`echo ${req.method}`)
        }
      })
    })
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve))
    base = `http://127.0.0.1:${(server.address() as AddressInfo).port}`
  })
  afterAll(() => new Promise<void>((resolve) => server.close(() => resolve())))

  it('sends the method, headers (Headers or a record) and a string body with its length', async () => {
    const body = JSON.stringify({model: 'm', note: 'héllo'})
    const response = await httpFetch(`${base}/echo`, {
      method: 'POST',
      headers: new Headers({'content-type': 'application/json', authorization: 'Bearer k'}),
      body,
    })
    expect(await response.text()).toBe('echo POST')
    const request = seen.at(-1)!
    expect(request.body).toBe(body)
    expect(request.headers['content-length']).toBe(String(Buffer.byteLength(body)))
    expect(request.headers.authorization).toBe('Bearer k')
    await httpFetch(`${base}/echo`, {headers: {'x-custom': 'yes'}})
    expect(seen.at(-1)!.headers['x-custom']).toBe('yes')
  })

  it('asks for compressed responses and decodes them', async () => {
    const response = await httpFetch(`${base}/gzip`)
    expect(seen.at(-1)!.headers['accept-encoding']).toMatch(/gzip/)
    expect(await response.json()).toEqual({hello: 'world'})
  })

  it('gives a 204 a null body and keeps every header, repeated ones included', async () => {
    const response = await httpFetch(`${base}/empty`)
    expect(response.status).toBe(204)
    expect(response.body).toBeNull()
    expect(response.headers.get('x-request-id')).toBe('req_1')
    expect(response.headers.getSetCookie()).toEqual(['a=1', 'b=2'])
    expect(response.url).toBe(`${base}/empty`)
  })

  it('returns a redirect instead of following it, so the API key is never sent elsewhere', async () => {
    const response = await httpFetch(`${base}/redirect`, {headers: {authorization: 'Bearer k'}})
    expect(response.status).toBe(302)
    expect(response.headers.get('location')).toBe('http://127.0.0.1:1/elsewhere')
  })

  it('an abort in the middle of a streamed body fails the read with an AbortError and closes the connection', async () => {
    const controller = new AbortController()
    const response = await httpFetch(`${base}/stream`, {signal: controller.signal})
    const reader = response.body!.getReader()
    expect(new TextDecoder().decode((await reader.read()).value)).toBe('data: first\n\n')
    controller.abort()
    await expect(reader.read()).rejects.toMatchObject({name: 'AbortError'})
    await streamClosed
  })

  it('an already aborted signal fails at once with an AbortError', async () => {
    const controller = new AbortController()
    controller.abort()
    await expect(httpFetch(`${base}/echo`, {signal: controller.signal})).rejects.toMatchObject({name: 'AbortError'})
  })

  it('a refused connection fails with the system error code the SDKs report', async () => {
    const port = await freePort()
    await expect(httpFetch(`http://127.0.0.1:${port}/`)).rejects.toMatchObject({code: 'ECONNREFUSED'})
  })
})
