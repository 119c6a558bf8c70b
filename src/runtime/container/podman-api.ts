import fs from 'node:fs'
import {EngineApi} from '../../sandbox/docker/engine-api.js'
import type {EngineConfig} from '../config/types.js'
import {GatewayError} from '../util/errors.js'
import {startSubprocess} from '../util/subprocess.js'
import {SSH_WRAPPER, sshArgsOf, sshEnvOf} from './engine-ssh.js'

/**
 * A GET of a Podman engine's own API: over its unix socket; on tcp://, with the engine's mutual
 * TLS files (a TLS proxy in front of `podman system service`, which has no TLS itself); on ssh://,
 * through `podman system dial-stdio` there. For what the docker CLI cannot ask or asks too
 * slowly: Podman answers `docker version` in ≈ 1.5 s (it runs conmon and the OCI runtime to
 * report them), `/_ping` in a few ms.
 */
export async function podmanGet(engine: EngineConfig, endpoint: string, timeoutMs: number): Promise<string> {
  const host = engine.host ?? ''
  if (host.startsWith('unix://')) {
    return new EngineApi(host.slice('unix://'.length)).getText(endpoint, {timeoutMs})
  }
  if (host.startsWith('ssh://')) return podmanGetOverSsh(engine, endpoint, timeoutMs)
  if (!host.startsWith('tcp://') || !engine.tls)
    throw new GatewayError(
      'E_CONFIG',
      `engine ${engine.name}: a Podman engine is reached on unix://, ssh://, or tcp:// with tls`,
    )
  const url = new URL(host.replace(/^tcp:/, 'https:'))
  const tls = engine.tls
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
          const body = Buffer.concat(chunks).toString('utf8')
          if ((response.statusCode ?? 500) >= 400)
            reject(new Error(`${endpoint} answered ${response.statusCode}: ${body.slice(0, 200)}`))
          else resolve(body)
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
async function podmanGetOverSsh(engine: EngineConfig, endpoint: string, timeoutMs: number): Promise<string> {
  const inherited = Object.fromEntries(
    ['HOME', 'USER', 'SSH_AUTH_SOCK'].flatMap((name) => (process.env[name] ? [[name, process.env[name]!]] : [])),
  )
  const result = await startSubprocess(SSH_WRAPPER, sshArgsOf(engine.host!, ['podman', 'system', 'dial-stdio']), {
    env: {...inherited, ...sshEnvOf(engine)},
    stdio: ['pipe', 'pipe', 'pipe'],
    input: `GET ${endpoint} HTTP/1.0\r\nHost: podman\r\n\r\n`,
    timeoutMs,
  })
  if (result.timedOut) throw new Error(`no answer within ${timeoutMs} ms`)
  const status = /^HTTP\/1\.[01] (\d{3}) /.exec(result.stdout)
  const headersEnd = result.stdout.indexOf('\r\n\r\n')
  if (!status || headersEnd < 0)
    throw new Error(
      `no answer from Podman over ssh (${result.message}): ${result.stderr.trim().split('\n').pop() || 'nothing on stderr'}`,
    )
  const body = result.stdout.slice(headersEnd + 4)
  if (Number(status[1]) >= 400) throw new Error(`${endpoint} answered ${status[1]}: ${body.slice(0, 200)}`)
  return body
}

/** Resolves when the engine answers `/_ping` within `timeoutMs`. */
export async function pingPodman(engine: EngineConfig, timeoutMs: number): Promise<void> {
  const answer = await podmanGet(engine, '/_ping', timeoutMs)
  if (answer.trim() !== 'OK')
    throw new GatewayError('E_DOCKER_DOWN', `engine ${engine.name} answered /_ping with "${answer.slice(0, 80)}"`)
}
