import fs from 'node:fs'
import http from 'node:http'
import os from 'node:os'
import path from 'node:path'

/**
 * An engine that lies: a Docker Engine API on a unix socket of the test's own, answering the
 * docker CLI's and the gateway's questions with whatever the test forges (a compromised engine
 * host, or a man in the middle of an `insecure: true` one). Only what a lie needs is served:
 * `_ping`, `version`, `info`, the container, image and volume lists, an image's and a volume's
 * inspect, volume removal, and a build that reads what it is sent and then fails; anything else is a 404 in the
 * engine's own error shape. Every request is recorded, with its headers (what the engine learns).
 *
 *   const engine = await startLyingEngine({volumes: (prefix) => [`${prefix}../../x`]})
 *   // engines: [{name: 'liar', host: engine.host}]
 *   await engine.close()
 */
export interface LyingEngine {
  host: string
  requests: string[]
  /** The same requests with the headers the engine was sent. */
  received: Array<{request: string; headers: http.IncomingHttpHeaders}>
  close(): Promise<void>
}

export interface Lies {
  /** The workspace volumes it lists, given the name prefix the gateway filters by. */
  volumes?: (prefix: string) => string[]
  /** Its server version string. */
  version?: string
  /** The containers it lists (Engine API `containers/json` shape) and inspects; State defaults to running. */
  containers?: Array<{Id: string; Name: string; Labels: Record<string, string>; State?: string}>
  /** Where it says each volume it is asked about is mounted (`volume inspect`). */
  volumeMountpoint?: (name: string) => string
  /** The images it says it holds, by reference (Engine API `images/{name}/json` shape, as far as read). */
  images?: Record<string, {Id: string; Architecture: string; Os: string}>
}

export async function startLyingEngine(lies: Lies = {}): Promise<LyingEngine> {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'meepa-lying-engine-'))
  const socket = path.join(dir, 'engine.sock')
  const requests: string[] = []
  const received: LyingEngine['received'] = []
  const server = http.createServer((request, response) => {
    const url = new URL(request.url ?? '/', 'http://engine')
    const route = url.pathname.replace(/^\/v[\d.]+/, '')
    requests.push(`${request.method} ${route}`)
    received.push({request: `${request.method} ${route}`, headers: request.headers})
    const answer = (status: number, body: unknown) => {
      response.writeHead(status, {'Content-Type': 'application/json', 'Api-Version': '1.41'})
      response.end(JSON.stringify(body))
    }
    const containers = lies.containers ?? []
    if (route === '/_ping') return answer(200, 'OK')
    if (route === '/version')
      return answer(200, {Version: lies.version ?? '24.0.0', ApiVersion: '1.41', MinAPIVersion: '1.12', Os: 'linux'})
    if (route === '/info') return answer(200, {ServerVersion: lies.version ?? '24.0.0'})
    if (route === '/images/json') return answer(200, [])
    if (route === '/containers/json')
      return answer(
        200,
        containers.map((container) => ({
          Id: container.Id,
          Names: [`/${container.Name}`],
          State: container.State ?? 'running',
          Labels: container.Labels,
        })),
      )
    const image = /^\/images\/(.+)\/json$/.exec(route)?.[1]
    if (image !== undefined && request.method === 'GET') {
      const held = lies.images?.[decodeURIComponent(image)]
      return held ? answer(200, {...held, RepoTags: [], Config: {}}) : answer(404, {message: `No such image: ${image}`})
    }
    if (route === '/build' && request.method === 'POST') {
      request.resume() // the build context, read and dropped
      request.on('end', () => {
        response.writeHead(200, {'Content-Type': 'application/json', 'Api-Version': '1.41'})
        response.end(
          `${JSON.stringify({errorDetail: {message: 'this engine builds nothing'}, error: 'this engine builds nothing'})}\n`,
        )
      })
      return
    }
    const inspected = containers.find((container) => route === `/containers/${container.Id}/json`)
    if (inspected)
      return answer(200, {
        Id: inspected.Id,
        Name: `/${inspected.Name}`,
        Created: new Date().toISOString(),
        Image: `sha256:${'a'.repeat(64)}`,
        State: {Status: inspected.State ?? 'running', Running: (inspected.State ?? 'running') === 'running'},
        Config: {Image: 'image', Labels: inspected.Labels},
      })
    if (route === '/volumes' && request.method === 'GET') {
      const filters = JSON.parse(url.searchParams.get('filters') ?? '{}') as {name?: Record<string, boolean>}
      const prefix = Object.keys(filters.name ?? {})[0] ?? ''
      const names = lies.volumes?.(prefix) ?? []
      return answer(200, {
        Volumes: names.map((Name) => ({Name, Driver: 'local', Labels: {}, Scope: 'local'})),
        Warnings: [],
      })
    }
    if (route.startsWith('/volumes/') && request.method === 'GET' && lies.volumeMountpoint) {
      const name = decodeURIComponent(route.slice('/volumes/'.length))
      return answer(200, {
        Name: name,
        Driver: 'local',
        Mountpoint: lies.volumeMountpoint(name),
        Labels: {},
        Scope: 'local',
      })
    }
    if (route.startsWith('/volumes/') && request.method === 'DELETE') {
      response.writeHead(204)
      return response.end()
    }
    answer(404, {message: `no such route: ${request.method} ${route}`})
  })
  await new Promise<void>((resolve) => server.listen(socket, resolve))
  return {
    host: `unix://${socket}`,
    requests,
    received,
    close: async () => {
      await new Promise((resolve) => server.close(resolve))
      fs.rmSync(dir, {recursive: true, force: true})
    },
  }
}
