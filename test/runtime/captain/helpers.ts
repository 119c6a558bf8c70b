import type {LoadedConfig} from '../../../src/runtime/config/types.js'
import {loadConfig} from '../../../src/runtime/config/load.js'
import {Router} from '../../../src/runtime/http/router.js'
import {startHttpListener, type HttpListener} from '../../../src/runtime/http/server.js'
import {mountCaptain, type Captain, type CaptainDeps} from '../../../src/runtime/captain/index.js'
import {openGatewayDb, type GatewayDb} from '../../../src/runtime/state/gateway-db.js'
import {DockerCli} from '../../../src/sandbox/docker/cli.js'
import {makeHome, type TestHome} from '../../helpers/home.js'

export const PASSWORD = 'correct horse battery'

/** A config with one provider and the given agents (no network is used by the dashboard API). */
export function captainConfig(agents: Array<Record<string, unknown>> = [{id: 'meepa', name: 'Meepa'}]): string {
  return [
    '# operator comment at the top',
    'providers:',
    '  primary: fake',
    '  providers:',
    '    fake: {kind: openai, api_key_env: FAKE_LLM_KEY, model: fake-model, base_url: "http://127.0.0.1:9/v1"}',
    'image_config:',
    '  base_image: debian:bookworm-slim  # the base we import locally',
    '  packages: []',
    'agents:',
    ...agents.map((agent) => `  - ${JSON.stringify(agent)}`),
    '',
  ].join('\n')
}

export interface CaptainHarness {
  url: string
  home: TestHome
  db: GatewayDb
  captain: Captain
  loaded: LoadedConfig
  logs: string[]
  close(): Promise<void>
  /** fetch against the harness with JSON in and out. */
  request(
    method: string,
    path: string,
    options?: {body?: unknown; headers?: Record<string, string>},
  ): Promise<{status: number; body: any; headers: Headers}>
  /** Logs in with PASSWORD and returns the session token for later requests. */
  login(): Promise<{token: string}>
}

/** A Docker CLI that does not exist: container routes then fail the way they do without Docker. */
export const NO_DOCKER = new DockerCli({bin: '/nonexistent/docker'})

export async function startCaptain(
  options: {config?: string; env?: Record<string, string>; docker?: DockerCli; deps?: Partial<CaptainDeps>} = {},
): Promise<CaptainHarness> {
  const home = makeHome(options.config ?? captainConfig())
  const env = {MEEPAGATEWAY_PASSWORD: PASSWORD, FAKE_LLM_KEY: 'sk-test', ...options.env}
  for (const [key, value] of Object.entries(env)) if (value === '') delete (env as Record<string, string>)[key]
  const loaded = loadConfig({home: home.home, env})
  const db = openGatewayDb(home.home)
  const router = new Router()
  const logs: string[] = []
  const log = (line: string) => logs.push(line)
  const docker = options.docker ?? NO_DOCKER
  const captain = await mountCaptain(router, {
    db,
    loaded,
    log,
    env,
    docker,
    ...options.deps,
  })
  const http: HttpListener = await startHttpListener({bind: '127.0.0.1', port: 0, router, log})
  captain.announce(http.url)
  const request: CaptainHarness['request'] = async (method, path, requestOptions = {}) => {
    const headers: Record<string, string> = {...requestOptions.headers}
    if (requestOptions.body !== undefined) headers['content-type'] = 'application/json'
    const res = await fetch(http.url + path, {
      method,
      headers,
      body: requestOptions.body === undefined ? undefined : JSON.stringify(requestOptions.body),
      redirect: 'manual',
    })
    const text = await res.text()
    let body: unknown = text
    try {
      body = JSON.parse(text)
    } catch {
      // not JSON (static files)
    }
    return {status: res.status, body, headers: res.headers}
  }
  return {
    url: http.url,
    home,
    db,
    captain,
    loaded,
    logs,
    request,
    async login() {
      const res = await request('POST', '/api/captain/auth/login', {body: {password: PASSWORD}})
      if (res.status !== 200) throw new Error(`login failed: ${res.status} ${JSON.stringify(res.body)}`)
      return {token: res.body.token as string}
    },
    async close() {
      captain.close()
      await http.close()
      db.close()
      home.cleanup()
    },
  }
}

/** Headers of the logged-in dashboard page: its session token as a bearer credential. */
export function sessionHeaders(session: {token: string}): Record<string, string> {
  return {authorization: `Bearer ${session.token}`}
}
