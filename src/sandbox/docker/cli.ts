import {execa, type ResultPromise} from 'execa'
import fs from 'node:fs'
import path from 'node:path'
import {keeperArgv, keeperHelper} from '../keeper.js'
import {GatewayError} from '../../runtime/util/errors.js'

/**
 * The one way the gateway talks to Docker: the docker CLI through execa, every call bounded by a
 * deadline and an AbortSignal. The CLI blocks forever when the engine hangs (it accepts the
 * connection and never answers), so a call without a deadline could wedge the whole gateway.
 */

/** Overrides the docker CLI to use (an absolute path or a name looked up on PATH). */
export const DOCKER_BIN_ENV = 'MEEPAGATEWAY_DOCKER_BIN'

/** Deadline for calls that only talk to the engine (inspect, ps, rm, kill, version). */
export const DEFAULT_DOCKER_TIMEOUT_MS = 30_000

/**
 * Variables the docker CLI itself reads. Everything else is left out of its environment, so the
 * CLI never holds a secret unless a run asks for one to be forwarded (see `DockerCallOptions.env`).
 */
const DOCKER_CLI_ENV_NAMES = [
  'PATH', 'HOME', 'USER', 'XDG_RUNTIME_DIR', 'XDG_CONFIG_HOME',
  'DOCKER_HOST', 'DOCKER_CONTEXT', 'DOCKER_CONFIG', 'DOCKER_CERT_PATH', 'DOCKER_TLS_VERIFY',
  'DOCKER_API_VERSION', 'DOCKER_BUILDKIT', 'SSH_AUTH_SOCK',
  'HTTP_PROXY', 'HTTPS_PROXY', 'NO_PROXY', 'http_proxy', 'https_proxy', 'no_proxy',
]

export interface DockerCliOptions {
  /** The docker executable; default $MEEPAGATEWAY_DOCKER_BIN, then `docker` on PATH. */
  bin?: string
  /** The environment the CLI is started from; default process.env (only DOCKER_CLI_ENV_NAMES are kept). */
  baseEnv?: NodeJS.ProcessEnv
  /** Deadline for calls that set none. */
  defaultTimeoutMs?: number
}

export interface DockerCallOptions {
  timeoutMs?: number
  signal?: AbortSignal
  input?: string
  /** Leaves stdin a pipe for the caller to write (a `docker run -i` whose input comes later). */
  openStdin?: boolean
  /** stdout is read by the caller as it comes (agent-run's LLM channel) and not buffered in the result. */
  streamStdout?: boolean
  /** Extra variables for the CLI process (e.g. values forwarded with `-e NAME`, which never appear in argv). */
  env?: Record<string, string>
  /** Called with each line of stdout and stderr as it arrives (build progress). */
  onLine?: (line: string, stream: 'stdout' | 'stderr') => void
  /** Working directory of the CLI process. */
  cwd?: string
  /**
   * `docker run` of this container name: the client runs under the keeper, which removes the
   * container when this process dies (a gateway killed mid-run must not leave it running).
   */
  removeIfOwnerDies?: string
}

export interface DockerResult {
  stdout: string
  stderr: string
  exitCode: number
}

/** A docker call that exited non-zero for a reason other than the engine being unreachable. */
export class DockerCommandError extends GatewayError {
  constructor(readonly args: string[], readonly result: DockerResult) {
    super('E_DOCKER', `docker ${args[0] ?? ''} failed (exit ${result.exitCode}): ${lastLines(result.stderr || result.stdout, 5)}`, {
      details: {exit_code: result.exitCode, stderr_tail: result.stderr.slice(-4096)},
    })
    this.name = 'DockerCommandError'
  }
}

export class DockerCli {
  readonly bin: string
  /** True when the binary came from $MEEPAGATEWAY_DOCKER_BIN (the fix then differs). */
  readonly binFromEnv: boolean
  private readonly baseEnv: NodeJS.ProcessEnv
  private readonly defaultTimeoutMs: number

  constructor(options: DockerCliOptions = {}) {
    const baseEnv = options.baseEnv ?? process.env
    this.binFromEnv = options.bin === undefined && Boolean(baseEnv[DOCKER_BIN_ENV])
    this.bin = options.bin ?? (baseEnv[DOCKER_BIN_ENV] || 'docker')
    this.baseEnv = baseEnv
    this.defaultTimeoutMs = options.defaultTimeoutMs ?? DEFAULT_DOCKER_TIMEOUT_MS
  }

  /** The complete environment of a docker CLI process. */
  env(extra: Record<string, string> = {}): Record<string, string> {
    const env: Record<string, string> = {}
    for (const name of DOCKER_CLI_ENV_NAMES) {
      const value = this.baseEnv[name]
      if (value !== undefined) env[name] = value
    }
    env.PATH ??= '/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin'
    return {...env, ...extra}
  }

  /**
   * Starts a docker call without waiting for it; the caller owns the child (used by `docker run`,
   * whose deadline the runner enforces on the container, not just on the client).
   */
  spawn(args: string[], options: DockerCallOptions & {timeoutMs: number}): ResultPromise<{reject: false}> {
    // a missing docker must still fail as ENOENT (E_DOCKER_MISSING), not as the keeper's exit 127
    const helper = options.removeIfOwnerDies && this.found() ? keeperHelper() : undefined
    const [file, ...argv] = helper
      ? keeperArgv(helper, 3, {onOrphan: [this.bin, 'rm', '--force', options.removeIfOwnerDies as string]}, [this.bin, ...args])
      : [this.bin, ...args]
    const stdin = options.input === undefined && !options.openStdin ? 'ignore' : 'pipe'
    const child = execa(file as string, argv, {
      env: this.env(options.env),
      extendEnv: false,
      cwd: options.cwd,
      input: options.input,
      // fd 3: the keeper's lifeline, held open by this process until the client exits
      stdio: helper ? [stdin, 'pipe', 'pipe', 'pipe'] : [stdin, 'pipe', 'pipe'],
      buffer: options.streamStdout ? {stdout: false} : true,
      reject: false,
      timeout: options.timeoutMs,
      cancelSignal: options.signal,
      forceKillAfterDelay: 2000,
      stripFinalNewline: true,
      maxBuffer: 64 * 1024 * 1024,
    } as const) as unknown as ResultPromise<{reject: false}>
    if (options.onLine) forwardLines(child, options.onLine)
    return child
  }

  /** Whether the docker executable exists (an absolute path, or a name on the CLI's PATH). */
  private found(): boolean {
    const candidates = this.bin.includes('/') ? [this.bin] : (this.env().PATH ?? '').split(':').filter(Boolean).map((dir) => path.join(dir, this.bin))
    return candidates.some((candidate) => {
      try {
        fs.accessSync(candidate, fs.constants.X_OK)
        return true
      } catch {
        return false
      }
    })
  }

  /** Runs one docker call; never throws for a non-zero exit (use `check` for that). */
  async exec(args: string[], options: DockerCallOptions = {}): Promise<DockerResult> {
    const timeoutMs = options.timeoutMs ?? this.defaultTimeoutMs
    const result = await this.spawn(args, {...options, timeoutMs})
    const stdout = String(result.stdout ?? '')
    const stderr = String(result.stderr ?? '')
    if (result.code === 'ENOENT' || (result.failed && result.exitCode === undefined && /ENOENT/.test(result.message ?? ''))) {
      throw dockerMissing(this.bin, this.binFromEnv)
    }
    if (result.timedOut) throw dockerHung(args, timeoutMs)
    if (result.isCanceled) throw new GatewayError('E_DOCKER', `docker ${args[0] ?? ''} was cancelled`, {retryable: true})
    const exitCode = result.exitCode ?? 1
    if (exitCode !== 0) {
      const engineError = engineErrorOf(stderr)
      if (engineError) throw engineError
    }
    return {stdout, stderr, exitCode}
  }

  /** Runs one docker call and throws DockerCommandError on a non-zero exit. */
  async check(args: string[], options: DockerCallOptions = {}): Promise<DockerResult> {
    const result = await this.exec(args, options)
    if (result.exitCode !== 0) throw new DockerCommandError(args, result)
    return result
  }

  /** Engine version, or E_DOCKER_MISSING / E_DOCKER_DOWN / E_DOCKER_HUNG with the fix. */
  async ping(options: DockerCallOptions = {}): Promise<{client: string; server: string}> {
    const result = await this.check(['version', '--format', '{{json .}}'], {timeoutMs: 10_000, ...options})
    const parsed = JSON.parse(result.stdout) as {Client?: {Version?: string}; Server?: {Version?: string} | null}
    if (!parsed.Server?.Version) throw dockerDown(result.stderr)
    return {client: parsed.Client?.Version ?? 'unknown', server: parsed.Server.Version}
  }
}

let defaultCli: DockerCli | undefined

/** The process-wide docker CLI (honours $MEEPAGATEWAY_DOCKER_BIN at first use). */
export function dockerCli(): DockerCli {
  defaultCli ??= new DockerCli()
  return defaultCli
}

function forwardLines(child: ResultPromise, onLine: (line: string, stream: 'stdout' | 'stderr') => void): void {
  for (const stream of ['stdout', 'stderr'] as const) {
    let pending = ''
    child[stream]?.on('data', (chunk: Buffer) => {
      pending += chunk.toString('utf8')
      const lines = pending.split(/\r?\n|\r/)
      pending = lines.pop() ?? ''
      for (const line of lines) if (line.trim()) onLine(line, stream)
    })
    child[stream]?.on('end', () => {
      if (pending.trim()) onLine(pending, stream)
      pending = ''
    })
  }
}

function lastLines(text: string, count: number): string {
  return text.trim().split('\n').slice(-count).join(' | ') || '(no output)'
}

/**
 * The engine-level reason a docker call failed (engine down, no permission), read from the CLI's
 * stderr; undefined when the failure is the command's own (for callers that own the child).
 */
export function engineErrorOf(stderr: string): GatewayError | undefined {
  if (/permission denied while trying to connect/i.test(stderr)) return dockerPermission(stderr)
  if (/Cannot connect to the Docker daemon|Is the docker daemon running|error during connect|connect: no such file or directory|connect: connection refused|dial unix .*: connect/i.test(stderr)) {
    return dockerDown(stderr)
  }
  return undefined
}

export function dockerMissing(bin: string, fromEnv: boolean): GatewayError {
  return new GatewayError('E_DOCKER_MISSING', fromEnv
    ? `the docker CLI was not found at ${DOCKER_BIN_ENV}=${bin}`
    : `the docker CLI (${bin}) was not found${bin.includes('/') ? '' : ' on PATH'}`, {
    suggestions: [
      'install Docker (Debian/Ubuntu: apt-get install docker.io; macOS: Docker Desktop or colima)',
      `or point ${DOCKER_BIN_ENV} at the docker executable`,
      'or turn container_mode off for the agent',
    ],
  })
}

function dockerDown(stderr: string): GatewayError {
  const host = process.env.DOCKER_HOST
  return new GatewayError('E_DOCKER_DOWN', `the Docker engine is not running or not reachable${host ? ` at DOCKER_HOST=${host}` : ''}: ${lastLines(stderr, 2)}`, {
    retryable: true,
    suggestions: [
      'start the engine: sudo systemctl start docker (Docker Desktop: open the app)',
      host ? `check DOCKER_HOST=${host}, or unset it to use the default socket` : 'check `docker info` works for this user',
    ],
  })
}

function dockerHung(args: string[], timeoutMs: number): GatewayError {
  return new GatewayError('E_DOCKER_HUNG', `the Docker engine did not answer \`docker ${args[0] ?? ''}\` within ${Math.round(timeoutMs / 1000)} s; it seems hung`, {
    retryable: true,
    suggestions: [
      'restart the engine: sudo systemctl restart docker (Docker Desktop: restart it)',
      'check `timeout 10 docker info`, and the engine log (journalctl -u docker)',
    ],
  })
}

function dockerPermission(stderr: string): GatewayError {
  return new GatewayError('E_DOCKER', `this user may not use the Docker engine: ${lastLines(stderr, 1)}`, {
    suggestions: ['add the user to the docker group (sudo usermod -aG docker $USER, then log in again)', 'or run the gateway as a user that may use Docker'],
  })
}
