import fs from 'node:fs'
import {EngineApi, parseHttpAnswer, type EngineAnswer} from '../../sandbox/docker/engine-api.js'
import {SMALL_ANSWER_MAX_BYTES} from '../../sandbox/docker/engine.js'
import {engineAnswerTooLarge} from '../../sandbox/docker/errors.js'
import type {EngineConfig} from '../config/types.js'
import {GatewayError} from '../util/errors.js'
import {SSH_WRAPPER, sshArgsOf, sshEnvOf} from './engine-ssh.js'

/**
 * A GET of a Podman engine's own API: over its unix socket; on tcp://, with the engine's mutual
 * TLS files (a TLS proxy in front of `podman system service`, which has no TLS itself); on ssh://,
 * through `podman system dial-stdio` there. For what the docker CLI cannot ask or asks too
 * slowly: Podman answers `docker version` in ≈ 1.5 s (it runs conmon and the OCI runtime to
 * report them), `/_ping` in a few ms. The body of a 2xx answer; an error otherwise. Every way
 * has one deadline for the whole answer and collects at most SMALL_ANSWER_MAX_BYTES of it (only
 * `/_ping` and `libpod/info` are asked), so a trickling, flooding or cut-off engine fails in time.
 */
export async function podmanGet(engine: EngineConfig, endpoint: string, timeoutMs: number): Promise<string> {
  return (await podmanAnswer(engine, endpoint, timeoutMs)).body
}

async function podmanAnswer(engine: EngineConfig, endpoint: string, timeoutMs: number): Promise<EngineAnswer> {
  const host = engine.host ?? ''
  const tooLarge = () =>
    engineAnswerTooLarge(`Podman engine ${engine.name} (${host})`, `GET ${endpoint}`, SMALL_ANSWER_MAX_BYTES)
  let answer: EngineAnswer
  if (host.startsWith('unix://'))
    answer = await new EngineApi(host.slice('unix://'.length)).get(endpoint, {
      timeoutMs,
      maxBytes: SMALL_ANSWER_MAX_BYTES,
    })
  else if (host.startsWith('ssh://')) answer = await podmanOverSsh(engine, endpoint, timeoutMs, tooLarge)
  else if (host.startsWith('tcp://') && engine.tls) answer = await podmanOverTls(engine, endpoint, timeoutMs, tooLarge)
  else
    throw new GatewayError(
      'E_CONFIG',
      `engine ${engine.name}: a Podman engine is reached on unix://, ssh://, or tcp:// with tls`,
    )
  if (answer.status >= 400) throw new Error(`${endpoint} answered ${answer.status}: ${answer.body.slice(0, 200)}`)
  return answer
}

/**
 * Over mutual TLS, under one deadline for the whole answer (not an idle timeout: an engine that
 * trickles a byte at a time is cut at it too); past the size cap, or cut off mid-answer, it fails.
 */
async function podmanOverTls(
  engine: EngineConfig,
  endpoint: string,
  timeoutMs: number,
  tooLarge: () => Error,
): Promise<EngineAnswer> {
  const url = new URL(engine.host!.replace(/^tcp:/, 'https:'))
  const tls = engine.tls!
  // loaded here: TLS, crypto and Node's HTTP client cost every `config check` ≈ 6 ms at start
  const https = process.getBuiltinModule('node:https')
  return new Promise((resolve, reject) => {
    let settled = false
    const settle = (error: Error | undefined, answer?: EngineAnswer) => {
      if (settled) return
      settled = true
      clearTimeout(deadline)
      if (!error) return resolve(answer!)
      request.destroy()
      reject(error)
    }
    const cutOff = () => settle(new Error(`the connection closed before the whole answer to GET ${endpoint}`))
    const request = https.get(
      {
        host: url.hostname,
        port: url.port,
        path: endpoint,
        ca: fs.readFileSync(tls.ca),
        cert: fs.readFileSync(tls.cert),
        key: fs.readFileSync(tls.key),
      },
      (response) => {
        const chunks: Buffer[] = []
        let size = 0
        response.on('data', (chunk: Buffer) => {
          size += chunk.length
          if (size > SMALL_ANSWER_MAX_BYTES) settle(tooLarge())
          else chunks.push(chunk)
        })
        response.on('end', () => {
          const headers = Object.fromEntries(
            Object.entries(response.headers).map(([name, value]) => [name, String(value ?? '')]),
          )
          settle(undefined, {status: response.statusCode ?? 500, headers, body: Buffer.concat(chunks).toString('utf8')})
        })
        response.on('aborted', cutOff)
        response.on('error', settle)
      },
    )
    const deadline = setTimeout(() => settle(new Error(`no whole answer within ${timeoutMs} ms`)), timeoutMs)
    request.on('error', settle)
    request.on('close', cutOff)
  })
}

/**
 * One HTTP/1.0 request through the ssh wrapper (host keys checked, as for the docker CLI) to the
 * far user's Podman service; the answer is whole when the connection closes. Past the size cap
 * the ssh client is killed and the call fails.
 */
async function podmanOverSsh(
  engine: EngineConfig,
  endpoint: string,
  timeoutMs: number,
  tooLarge: () => Error,
): Promise<EngineAnswer> {
  const inherited = Object.fromEntries(
    ['HOME', 'USER', 'SSH_AUTH_SOCK'].flatMap((name) => (process.env[name] ? [[name, process.env[name]!]] : [])),
  )
  // loaded here: execa is more than `config check` and `container status` should load at start
  const {startSubprocess} = await import('../util/subprocess.js')
  const cut = new AbortController()
  const child = startSubprocess(SSH_WRAPPER, sshArgsOf(engine.host!, ['podman', 'system', 'dial-stdio']), {
    env: {...inherited, ...sshEnvOf(engine)},
    stdio: ['pipe', 'pipe', 'pipe'],
    buffer: {stdout: false},
    input: `GET ${endpoint} HTTP/1.0\r\nHost: podman\r\n\r\n`,
    timeoutMs,
    signal: cut.signal,
    forceKillAfterMs: 1000,
  })
  let chunks: Buffer[] = []
  let size = 0
  child.stdout!.on('data', (chunk: Buffer) => {
    size += chunk.length
    if (size <= SMALL_ANSWER_MAX_BYTES) chunks.push(chunk)
    else if (!cut.signal.aborted) {
      chunks = []
      cut.abort()
    }
  })
  const result = await child
  if (result.timedOut) throw new Error(`no answer within ${timeoutMs} ms`)
  if (cut.signal.aborted) throw tooLarge()
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
