import fs from 'node:fs'
import os from 'node:os'
import path from 'node:path'
import {GatewayError} from '../../runtime/util/errors.js'
import type {RawContainer} from './containers.js'
import {
  ANSWER_MAX_BYTES,
  DEFAULT_DOCKER_TIMEOUT_MS,
  PING_TIMEOUT_MS,
  SMALL_ANSWER_MAX_BYTES,
  type EngineVersion,
} from './engine.js'
import {
  DOCKER_BIN_ENV,
  dockerCancelled,
  dockerDown,
  dockerHung,
  dockerPermission,
  engineAnswerTooLarge,
} from './errors.js'
import type {RawImage} from './images.js'

/**
 * Questions to a Docker engine on a local unix socket, and container removal, over its HTTP API: no docker CLI
 * process (a Go binary that costs tens of ms of CPU per start). Every request has a deadline and
 * honours an AbortSignal, like every docker CLI call, and fails with the same errors; no answer is
 * collected past its size cap (the connection is cut: a flood would fill memory). Only used
 * where the docker CLI would talk to that same socket (see localEngineSocket).
 */

/** Where the docker CLI finds the engine when nothing says otherwise. */
export const DEFAULT_DOCKER_SOCKET = '/var/run/docker.sock'

/**
 * The engine's socket when the docker CLI would use it too; undefined when only the CLI knows
 * where the engine is (a tcp or ssh DOCKER_HOST, a context) or when a docker binary is injected.
 */
export function localEngineSocket(env: NodeJS.ProcessEnv = process.env): string | undefined {
  if (env[DOCKER_BIN_ENV] || env.DOCKER_CONTEXT) return undefined
  const host = env.DOCKER_HOST
  if (host) return host.startsWith('unix://') ? host.slice('unix://'.length) : undefined
  return usesDefaultContext(env) ? DEFAULT_DOCKER_SOCKET : undefined
}

/**
 * `docker context use` writes currentContext into the CLI's config.json; anything but "default" is
 * the CLI's to resolve.
 */
function usesDefaultContext(env: NodeJS.ProcessEnv): boolean {
  const configDir = env.DOCKER_CONFIG || path.join(env.HOME || os.homedir(), '.docker')
  let text: string
  try {
    text = fs.readFileSync(path.join(configDir, 'config.json'), 'utf8')
  } catch {
    return true // no config: the default context
  }
  try {
    const context = (JSON.parse(text) as {currentContext?: unknown}).currentContext
    return context === undefined || context === '' || context === 'default'
  } catch {
    return false // a config the CLI may read differently: leave it to the CLI
  }
}

export interface EngineRequestOptions {
  /** GET unless said (DELETE removes a container or an image, POST creates one). */
  method?: 'GET' | 'DELETE' | 'POST'
  /** A POST's JSON body. */
  json?: unknown
  signal?: AbortSignal
  /** Deadline of the call, connecting included; default DEFAULT_DOCKER_TIMEOUT_MS. */
  timeoutMs?: number
  /** The most of the answer collected before the connection is cut; default ANSWER_MAX_BYTES. */
  maxBytes?: number
}

export interface EngineAnswer {
  status: number
  /** Names in lower case. */
  headers: Record<string, string>
  body: string
}

export class EngineApi {
  private dockerItself: Promise<boolean> | undefined

  constructor(
    readonly socketPath: string,
    private readonly options: {apiVersion?: string; defaultTimeoutMs?: number} = {},
  ) {}

  /** Engine version, or E_DOCKER_DOWN / E_DOCKER_HUNG with the fix (same contract as DockerCli.ping). */
  async ping(options: EngineRequestOptions = {}): Promise<EngineVersion> {
    const pinged = await this.call('/_ping', {timeoutMs: PING_TIMEOUT_MS, maxBytes: SMALL_ANSWER_MAX_BYTES, ...options})
    // Docker names its release in every answer's Server header: /version would cost the engine
    // ≈ 7 ms (it asks containerd)
    const server = /^Docker\/(\S+)/.exec(pinged.headers.server ?? '')?.[1]
    const api = pinged.headers['api-version']
    if (server && api) return {server, api}
    const version = parseJson<{Version?: string; ApiVersion?: string}>(
      await this.call('/version', {timeoutMs: PING_TIMEOUT_MS, maxBytes: SMALL_ANSWER_MAX_BYTES, ...options}),
      '/version',
    )
    return {server: version.Version ?? 'unknown', api: version.ApiVersion ?? 'unknown'}
  }

  /** A GET of an endpoint of the engine's own (Podman's `/_ping`, `/v4.0.0/libpod/info`), answered whole. */
  async get(endpoint: string, options: EngineRequestOptions = {}): Promise<EngineAnswer> {
    return this.call(endpoint, options)
  }

  /**
   * Every container (any state) carrying all of these labels (`name=value`), as
   * `docker container inspect` gives them.
   */
  containers(labels: string[], options: EngineRequestOptions = {}): Promise<RawContainer[]> {
    return this.labelled<RawContainer>('containers', labels, options)
  }

  /**
   * What `docker image inspect` prints for one image; undefined when there is no such image. `ref`
   * must be validated.
   */
  inspectImage(ref: string, options: EngineRequestOptions = {}): Promise<RawImage | undefined> {
    return this.found<RawImage>(`/images/${ref}/json`, options)
  }

  /** Every image carrying all of these labels (`name=value`), as `docker image inspect` gives them. */
  images(labels: string[], options: EngineRequestOptions = {}): Promise<RawImage[]> {
    return this.labelled<RawImage>('images', labels, options)
  }

  /**
   * Listed by label, then each inspected; one removed in between (its runner, another
   * `container clean`) is skipped.
   */
  private async labelled<T>(
    kind: 'containers' | 'images',
    labels: string[],
    options: EngineRequestOptions,
  ): Promise<T[]> {
    const filters = encodeURIComponent(JSON.stringify({label: labels}))
    const listed = parseJson<Array<{Id: string}>>(
      await this.call(`/${kind}/json?${kind === 'containers' ? 'all=1&' : ''}filters=${filters}`, options),
      `/${kind}/json`,
    )
    const inspected = await Promise.all(listed.map(({Id}) => this.found<T>(`/${kind}/${Id}/json`, options)))
    return inspected.filter((item): item is Awaited<T> => item !== undefined)
  }

  /**
   * `docker image rm REF` (a tag is removed, and the image with its last one): undefined when done
   * or already gone, else why the engine refused (a container uses it...). `ref` must be validated.
   */
  async removeImage(ref: string, options: EngineRequestOptions = {}): Promise<string | undefined> {
    const answer = await this.call(`/images/${ref}`, {...options, method: 'DELETE'}, () => true)
    return answer.status < 400 || answer.status === 404 ? undefined : refusalOf(answer)
  }

  /**
   * `docker create`: the container named `name` from the engine's own body (see run-args.ts);
   * fails as the engine refuses (no such image, a name taken).
   */
  async createContainer(name: string, config: object, options: EngineRequestOptions = {}): Promise<string[]> {
    const created = await this.call(
      `/containers/create?name=${encodeURIComponent(name)}`,
      {...options, method: 'POST', json: config},
      () => false,
    )
    // what the engine dropped (a limit its kernel cannot apply): the CLI printed these as WARNING lines
    return parseJson<{Warnings?: string[] | null}>(created, '/containers/create').Warnings ?? []
  }

  /** Whether Docker itself answers here (Podman's compatible API names itself Libpod), asked once. */
  isDocker(options: EngineRequestOptions = {}): Promise<boolean> {
    this.dockerItself ??= this.call('/_ping', {
      timeoutMs: PING_TIMEOUT_MS,
      maxBytes: SMALL_ANSWER_MAX_BYTES,
      ...options,
    }).then(
      (answer) => /^Docker\//.test(answer.headers.server ?? ''),
      (error: unknown) => {
        this.dockerItself = undefined
        throw error
      },
    )
    return this.dockerItself
  }

  /** `docker rm --force --volumes` of one container: gone already (404) or being removed (409) is done too. */
  async removeContainer(nameOrId: string, options: EngineRequestOptions = {}): Promise<void> {
    await this.call(
      `/containers/${encodeURIComponent(nameOrId)}?force=1&v=1`,
      {...options, method: 'DELETE'},
      (status) => status === 404 || status === 409,
    )
  }

  /** A GET whose 404 means "not there". */
  private async found<T>(endpoint: string, options: EngineRequestOptions): Promise<T | undefined> {
    const answer = await this.call(endpoint, options)
    return answer.status === 404 ? undefined : parseJson<T>(answer, endpoint)
  }

  /**
   * One request under one deadline and the caller's signal, failing as a docker CLI call would.
   * Unversioned paths are the engine's own (newest) API version, the one its /_ping names, so no
   * round trip is spent negotiating; DOCKER_API_VERSION pins a version, as it does for the CLI.
   */
  private async call(
    endpoint: string,
    options: EngineRequestOptions,
    answered: (status: number) => boolean = (status) => status === 404,
  ): Promise<EngineAnswer> {
    const timeoutMs = options.timeoutMs ?? this.options.defaultTimeoutMs ?? DEFAULT_DOCKER_TIMEOUT_MS
    const deadline = AbortSignal.timeout(timeoutMs)
    const signal = options.signal ? AbortSignal.any([options.signal, deadline]) : deadline
    const method = options.method ?? 'GET'
    const request = `${method} ${endpoint.split('?')[0]}`
    const maxBytes = options.maxBytes ?? ANSWER_MAX_BYTES
    try {
      const answer = await this.send(
        method,
        `${this.options.apiVersion ? `/v${this.options.apiVersion}` : ''}${endpoint}`,
        signal,
        options.json === undefined ? undefined : JSON.stringify(options.json),
        () => engineAnswerTooLarge(`the engine at unix://${this.socketPath}`, request, maxBytes),
        maxBytes,
      )
      if (answer.status >= 400 && !answered(answer.status)) throw engineRefused(request, answer)
      return answer
    } catch (error) {
      if (deadline.aborted) throw dockerHung(request, timeoutMs)
      if (signal.aborted) throw dockerCancelled(request)
      throw error instanceof GatewayError ? error : this.transportError(error, request)
    }
  }

  /**
   * One request on its own connection, in HTTP/1.0: the engine then answers without chunks and closes,
   * so the answer is what arrives before the close. node:http would do the same at ≈ 10 ms more
   * CPU (loading its client) per process, a quarter of what `container status` may take. Past
   * `maxBytes` the connection is cut and the call fails with `tooLarge()`.
   */
  private send(
    method: string,
    endpoint: string,
    signal: AbortSignal,
    json: string | undefined,
    tooLarge: () => Error,
    maxBytes: number,
  ): Promise<EngineAnswer> {
    // loaded at the first request: a command that only may ask (`config check`) starts ≈ 2 ms faster
    const net = process.getBuiltinModule('node:net')
    return new Promise((resolve, reject) => {
      const socket = net.connect({path: this.socketPath, signal})
      const chunks: Buffer[] = []
      let size = 0
      socket.on('data', (chunk: Buffer) => {
        size += chunk.length
        if (size > maxBytes) socket.destroy(tooLarge())
        else chunks.push(chunk)
      })
      socket.on('end', () => {
        try {
          resolve(parseHttpAnswer(Buffer.concat(chunks)))
        } catch (error) {
          reject(error)
        }
      })
      socket.on('error', reject)
      // not end(): a half-closed connection reads to the engine as a client that went away
      const body = json === undefined ? '' : json
      const headers =
        json === undefined ? '' : `Content-Type: application/json\r\nContent-Length: ${Buffer.byteLength(body)}\r\n`
      socket.write(
        `${method} ${endpoint} HTTP/1.0\r\nHost: docker\r\nUser-Agent: meepagateway\r\n${headers}\r\n${body}`,
      )
    })
  }

  /** In the CLI's words for a socket nobody listens on, or one this user may not open. */
  private transportError(error: unknown, request: string): GatewayError {
    const code = (error as NodeJS.ErrnoException).code
    const address = `unix://${this.socketPath}`
    if (code === 'EACCES' || code === 'EPERM')
      return dockerPermission(`permission denied while trying to connect to the Docker daemon socket at ${address}`)
    if (code === 'ENOENT' || code === 'ECONNREFUSED' || code === 'ENOTSOCK') {
      return dockerDown(`Cannot connect to the Docker daemon at ${address}. Is the docker daemon running? (${code})`)
    }
    return new GatewayError(
      'E_DOCKER',
      `the Docker engine at ${address} failed ${request}: ${(error as Error).message}`,
      {retryable: true, cause: error},
    )
  }
}

let localEngine: EngineApi | undefined

/** The process-wide Engine API client, when the engine is a local socket the docker CLI would use too. */
export function localEngineApi(env: NodeJS.ProcessEnv = process.env): EngineApi | undefined {
  const socket = localEngineSocket(env)
  if (!socket) return undefined
  if (localEngine?.socketPath !== socket)
    localEngine = new EngineApi(socket, {apiVersion: env.DOCKER_API_VERSION || undefined})
  return localEngine
}

/** Status, headers and body of an HTTP/1.x answer read to the connection's close. */
export function parseHttpAnswer(raw: Buffer): EngineAnswer {
  const end = raw.indexOf('\r\n\r\n')
  const [statusLine = '', ...lines] = (end < 0 ? '' : raw.subarray(0, end).toString('latin1')).split('\r\n')
  const status = /^HTTP\/1\.[01] (\d{3})/.exec(statusLine)?.[1]
  if (!status) throw new Error(`not an HTTP answer: ${JSON.stringify(raw.subarray(0, 80).toString('latin1'))}`)
  const headers: Record<string, string> = {}
  for (const line of lines) {
    const colon = line.indexOf(':')
    if (colon > 0) headers[line.slice(0, colon).trim().toLowerCase()] = line.slice(colon + 1).trim()
  }
  if (headers['transfer-encoding']) throw new Error(`an HTTP/1.0 answer in ${headers['transfer-encoding']} encoding`)
  const body = raw.subarray(end + 4)
  const length = headers['content-length'] === undefined ? body.length : Number(headers['content-length'])
  if (!(length <= body.length))
    throw new Error(`the answer ended after ${body.length} of ${headers['content-length']} bytes`)
  return {status: Number(status), headers, body: body.subarray(0, length).toString('utf8')}
}

function parseJson<T>(answer: EngineAnswer, endpoint: string): T {
  try {
    return JSON.parse(answer.body) as T
  } catch {
    throw new GatewayError(
      'E_DOCKER',
      `the Docker engine answered ${endpoint} with something that is not JSON: ${answer.body.slice(0, 200)}`,
    )
  }
}

/** The engine answered, and said no. */
function engineRefused(request: string, answer: EngineAnswer): GatewayError {
  const reason = refusalOf(answer)
  return new GatewayError('E_DOCKER', `the Docker engine refused ${request} (HTTP ${answer.status}): ${reason}`, {
    details: {http_status: answer.status, reason},
  })
}

/** Why the engine said no: its JSON `message`, or the plain text it sent. */
function refusalOf(answer: EngineAnswer): string {
  let message = answer.body.trim()
  try {
    message = (JSON.parse(answer.body) as {message?: string}).message ?? message
  } catch {
    // plain text
  }
  return message.slice(0, 500)
}
