import fs from 'node:fs'
import {EngineApi, parseHttpAnswer, type EngineAnswer} from '../../sandbox/docker/engine-api.js'
import type {EngineConfig} from '../config/types.js'
import {GatewayError} from '../util/errors.js'
import {SSH_WRAPPER, sshArgsOf, sshEnvOf} from './engine-ssh.js'

/**
 * A GET of a Podman engine's own API: over its unix socket; on tcp://, with the engine's mutual
 * TLS files (a TLS proxy in front of `podman system service`, which has no TLS itself); on ssh://,
 * through `podman system dial-stdio` there. For what the docker CLI cannot ask or asks too
 * slowly: Podman answers `docker version` in ≈ 1.5 s (it runs conmon and the OCI runtime to
 * report them), `/_ping` in a few ms. The body of a 2xx answer; an error otherwise.
 */
export async function podmanGet(engine: EngineConfig, endpoint: string, timeoutMs: number): Promise<string> {
  return (await podmanAnswer(engine, endpoint, timeoutMs)).body
}

async function podmanAnswer(engine: EngineConfig, endpoint: string, timeoutMs: number): Promise<EngineAnswer> {
  const host = engine.host ?? ''
  let answer: EngineAnswer
  if (host.startsWith('unix://')) answer = await new EngineApi(host.slice('unix://'.length)).get(endpoint, {timeoutMs})
  else if (host.startsWith('ssh://')) answer = await podmanOverSsh(engine, endpoint, timeoutMs)
  else if (host.startsWith('tcp://') && engine.tls) answer = await podmanOverTls(engine, endpoint, timeoutMs)
  else
    throw new GatewayError(
      'E_CONFIG',
      `engine ${engine.name}: a Podman engine is reached on unix://, ssh://, or tcp:// with tls`,
    )
  if (answer.status >= 400) throw new Error(`${endpoint} answered ${answer.status}: ${answer.body.slice(0, 200)}`)
  return answer
}

async function podmanOverTls(engine: EngineConfig, endpoint: string, timeoutMs: number): Promise<EngineAnswer> {
  const url = new URL(engine.host!.replace(/^tcp:/, 'https:'))
  const tls = engine.tls!
  // loaded here: TLS, crypto and Node's HTTP client cost every `config check` ≈ 6 ms at start
  const https = process.getBuiltinModule('node:https')
  return new Promise((resolve, reject) => {
    const request = https.get(
      {
        host: url.hostname,
        port: url.port,
        path: endpoint,
        ca: fs.readFileSync(tls.ca),
        cert: fs.readFileSync(tls.cert),
        key: fs.readFileSync(tls.key),
        timeout: timeoutMs,
      },
      (response) => {
        const chunks: Buffer[] = []
        response.on('data', (chunk: Buffer) => chunks.push(chunk))
        response.on('end', () => {
          const headers = Object.fromEntries(
            Object.entries(response.headers).map(([name, value]) => [name, String(value ?? '')]),
          )
          resolve({status: response.statusCode ?? 500, headers, body: Buffer.concat(chunks).toString('utf8')})
        })
      },
    )
    request.on('timeout', () => request.destroy(new Error(`no answer within ${timeoutMs} ms`)))
    request.on('error', reject)
  })
}

/**
 * One HTTP/1.0 request through the ssh wrapper (host keys checked, as for the docker CLI) to the
 * far user's Podman service; the answer is whole when the connection closes.
 */
async function podmanOverSsh(engine: EngineConfig, endpoint: string, timeoutMs: number): Promise<EngineAnswer> {
  const inherited = Object.fromEntries(
    ['HOME', 'USER', 'SSH_AUTH_SOCK'].flatMap((name) => (process.env[name] ? [[name, process.env[name]!]] : [])),
  )
  // loaded here: execa is more than `config check` and `container status` should load at start
  const {startSubprocess} = await import('../util/subprocess.js')
  const child = startSubprocess(SSH_WRAPPER, sshArgsOf(engine.host!, ['podman', 'system', 'dial-stdio']), {
    env: {...inherited, ...sshEnvOf(engine)},
    stdio: ['pipe', 'pipe', 'pipe'],
    buffer: {stdout: false},
    input: `GET ${endpoint} HTTP/1.0\r\nHost: podman\r\n\r\n`,
    timeoutMs,
  })
  const chunks: Buffer[] = []
  child.stdout!.on('data', (chunk: Buffer) => chunks.push(chunk))
  const result = await child
  if (result.timedOut) throw new Error(`no answer within ${timeoutMs} ms`)
  try {
    return parseHttpAnswer(Buffer.concat(chunks))
  } catch {
    throw new Error(
      `no answer from Podman over ssh (${result.message}): ${result.stderr.trim().split('\n').pop() || 'nothing on stderr'}`,
    )
  }
}

/** The engine's version ("Podman 4.3.1") once it answers `/_ping` within `timeoutMs`. */
export async function pingPodman(engine: EngineConfig, timeoutMs: number): Promise<string> {
  const answer = await podmanAnswer(engine, '/_ping', timeoutMs)
  if (answer.body.trim() !== 'OK')
    throw new GatewayError('E_DOCKER_DOWN', `engine ${engine.name} answered /_ping with "${answer.body.slice(0, 80)}"`)
  const version = answer.headers['libpod-api-version'] ?? /^Libpod\/(\S+)/.exec(answer.headers.server ?? '')?.[1]
  return version ? `Podman ${version}` : 'Podman'
}
