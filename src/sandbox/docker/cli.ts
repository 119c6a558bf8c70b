import fs from 'node:fs'
import os from 'node:os'
import path from 'node:path'
import {makeHomeDirectories} from '../../runtime/util/make-directories.js'
import {gatewayHome} from '../../runtime/util/paths.js'
import {startSubprocess, type Subprocess} from '../../runtime/util/subprocess.js'
import {keeperArgv, keeperHelper} from '../keeper.js'
import {DEFAULT_DOCKER_TIMEOUT_MS, PING_TIMEOUT_MS, type EngineVersion} from './engine.js'
import {
  DOCKER_BIN_ENV,
  DockerCommandError,
  dockerCancelled,
  dockerDown,
  dockerHung,
  dockerMissing,
  engineErrorOf,
} from './errors.js'

/**
 * The docker CLI as a child process, every call bounded by a deadline and an AbortSignal (read-only
 * questions of `container status` go over the Engine API instead when the engine is a local
 * socket: engine-api.ts). The CLI blocks forever when the engine hangs (it accepts the
 * connection and never answers), so a call without a deadline could wedge the whole gateway.
 */

/**
 * Variables the docker CLI itself reads. Everything else is left out of its environment, so the
 * CLI never holds a secret unless a run asks for one to be forwarded (see `DockerCallOptions.env`).
 */
export const DOCKER_CLI_ENV_NAMES = [
  'PATH',
  'HOME',
  'USER',
  'XDG_RUNTIME_DIR',
  'XDG_CONFIG_HOME',
  'DOCKER_HOST',
  'DOCKER_CONTEXT',
  'DOCKER_CONFIG',
  'DOCKER_CERT_PATH',
  'DOCKER_TLS_VERIFY',
  'DOCKER_API_VERSION',
  'DOCKER_BUILDKIT',
  'SSH_AUTH_SOCK',
  'HTTP_PROXY',
  'HTTPS_PROXY',
  'NO_PROXY',
  'http_proxy',
  'https_proxy',
  'no_proxy',
]

/** Variables that pick an engine: left out when the CLI is given its engine by flags. */
const ENGINE_CHOICE_ENV_NAMES = ['DOCKER_HOST', 'DOCKER_CONTEXT', 'DOCKER_CERT_PATH', 'DOCKER_TLS_VERIFY']

export interface DockerCliOptions {
  /** The docker executable; default $MEEPAGATEWAY_DOCKER_BIN, then `docker` on PATH. */
  bin?: string
  /** The environment the CLI is started from; default process.env (only DOCKER_CLI_ENV_NAMES are kept). */
  baseEnv?: NodeJS.ProcessEnv
  /** Deadline for calls that set none. */
  defaultTimeoutMs?: number
  /**
   * Global flags naming the engine (`--host tcp://… --tlsverify --tlscacert …`: paths, never a
   * secret) before every subcommand; the CLI's own DOCKER_HOST/DOCKER_CONTEXT/TLS variables are then dropped.
   */
  engineArgs?: string[]
  /** Variables the engine's transport reads in every call (the ssh wrapper's paths: never a secret). */
  engineEnv?: Record<string, string>
  /**
   * The CLI's config directory (DOCKER_CONFIG) when `engineArgs` name the engine; default
   * credentialFreeConfigDir() of the gateway home. Without `engineArgs` (the local engine) the
   * operator's own is kept.
   */
  configDir?: string
}

/**
 * What the CLI reads as its config.json for an engine of the `engines:` list: no credential, no
 * credsStore or credHelpers. The CLI sends every credential it can find to the engine with each
 * legacy `docker build` (X-Registry-Config), so the operator's registry logins (config.json, and
 * the helpers it names) would reach every remote engine. The one entry holds nothing: a config with
 * no `auths` at all makes the CLI look for a platform helper on PATH (docker-credential-pass,
 * -secretservice) and send what the operator's keyring holds instead. The operator's CLI plugins
 * (buildx installed per user) are still found: programs, not secrets. Its `proxies` are not taken:
 * the CLI would put them, credentials and all, in every container and build on that engine.
 */
export function credentialFreeConfig(baseEnv: NodeJS.ProcessEnv = process.env): string {
  const operatorDir = baseEnv.DOCKER_CONFIG || path.join(baseEnv.HOME || os.homedir(), '.docker')
  const config = {auths: {'meepagateway.invalid': {}}, cliPluginsExtraDirs: [path.join(operatorDir, 'cli-plugins')]}
  return `${JSON.stringify(config)}\n`
}

/** The gateway's own docker CLI config directory (mode 0700) for engines of the `engines:` list. */
export function credentialFreeConfigDir(home: string = gatewayHome()): string {
  return path.join(home, 'cache', 'docker-config')
}

/** Makes the directory and its config.json hold `content` (again if anything changed them). */
function prepareCredentialFreeConfig(dir: string, content: string): void {
  makeHomeDirectories(dir, path.dirname(path.dirname(dir)))
  const stat = fs.lstatSync(dir)
  if (!stat.isDirectory()) throw new Error(`${dir} is not a directory`)
  if ((stat.mode & 0o777) !== 0o700) fs.chmodSync(dir, 0o700)
  const file = path.join(dir, 'config.json')
  let current: string | undefined
  try {
    current = fs.readFileSync(file, 'utf8')
  } catch {
    // missing: written below (a CLI finding none would fall back to ~/.dockercfg)
  }
  if (current === content) return
  const written = `${file}.${process.pid}.tmp`
  fs.writeFileSync(written, content, {mode: 0o600})
  fs.renameSync(written, file) // another gateway process reading it sees the whole file
}

export interface DockerCallOptions {
  timeoutMs?: number
  signal?: AbortSignal
  input?: string | Buffer
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

export class DockerCli {
  readonly bin: string
  /** True when the binary came from $MEEPAGATEWAY_DOCKER_BIN (the fix then differs). */
  readonly binFromEnv: boolean
  private readonly baseEnv: NodeJS.ProcessEnv
  private readonly defaultTimeoutMs: number
  readonly engineArgs: string[]
  private readonly engineEnv: Record<string, string>
  /** The gateway's credential-free DOCKER_CONFIG, for an engine named by flags; unset for the local engine. */
  readonly configDir?: string

  constructor(options: DockerCliOptions = {}) {
    this.engineArgs = options.engineArgs ?? []
    this.engineEnv = options.engineEnv ?? {}
    const baseEnv = options.baseEnv ?? process.env
    if (this.engineArgs.length > 0) this.configDir = options.configDir ?? credentialFreeConfigDir(gatewayHome(baseEnv))
    this.binFromEnv = options.bin === undefined && Boolean(baseEnv[DOCKER_BIN_ENV])
    this.bin = options.bin ?? (baseEnv[DOCKER_BIN_ENV] || 'docker')
    this.baseEnv = baseEnv
    this.defaultTimeoutMs = options.defaultTimeoutMs ?? DEFAULT_DOCKER_TIMEOUT_MS
  }

  /**
   * The complete environment of a docker CLI process. An engine named by flags gets the gateway's
   * credential-free DOCKER_CONFIG (made here), never the operator's: see credentialFreeConfig.
   */
  env(extra: Record<string, string> = {}): Record<string, string> {
    const env: Record<string, string> = {}
    for (const name of DOCKER_CLI_ENV_NAMES) {
      if (this.engineArgs.length > 0 && ENGINE_CHOICE_ENV_NAMES.includes(name)) continue
      const value = this.baseEnv[name]
      if (value !== undefined) env[name] = value
    }
    env.PATH ??= '/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin'
    if (this.configDir !== undefined) {
      prepareCredentialFreeConfig(this.configDir, credentialFreeConfig(this.baseEnv))
      env.DOCKER_CONFIG = this.configDir
    }
    return {...env, ...this.engineEnv, ...extra}
  }

  /**
   * Starts a docker call without waiting for it; the caller owns the child (used by `docker run`,
   * whose deadline the runner enforces on the container, not just on the client).
   */
  spawn(args: string[], options: DockerCallOptions & {timeoutMs: number}): Subprocess {
    // a missing docker must still fail as ENOENT (E_DOCKER_MISSING), not as the keeper's exit 127
    const helper = options.removeIfOwnerDies && this.found() ? keeperHelper() : undefined
    const [file, ...argv] = helper
      ? keeperArgv(
          helper,
          3,
          {onOrphan: [this.bin, ...this.engineArgs, 'rm', '--force', options.removeIfOwnerDies as string]},
          [this.bin, ...this.engineArgs, ...args],
        )
      : [this.bin, ...this.engineArgs, ...args]
    const stdin = options.input === undefined && !options.openStdin ? 'ignore' : 'pipe'
    const child = startSubprocess(file as string, argv, {
      env: this.env(options.env),
      cwd: options.cwd,
      input: options.input,
      // fd 3: the keeper's lifeline, held open by this process until the client exits
      stdio: helper ? [stdin, 'pipe', 'pipe', 'pipe'] : [stdin, 'pipe', 'pipe'],
      buffer: {stdout: !options.streamStdout},
      timeoutMs: options.timeoutMs,
      signal: options.signal,
      forceKillAfterMs: 2000,
    })
    if (options.onLine) forwardLines(child, options.onLine)
    return child
  }

  /** Whether the docker executable exists (an absolute path, or a name on the CLI's PATH). */
  private found(): boolean {
    const candidates = this.bin.includes('/')
      ? [this.bin]
      : (this.env().PATH ?? '')
          .split(':')
          .filter(Boolean)
          .map((dir) => path.join(dir, this.bin))
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
    const {stdout, stderr} = result
    if (result.code === 'ENOENT') {
      throw dockerMissing(this.bin, this.binFromEnv)
    }
    if (result.timedOut) throw dockerHung(`\`docker ${args[0] ?? ''}\``, timeoutMs)
    if (result.isCanceled) throw dockerCancelled(`docker ${args[0] ?? ''}`)
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
  async ping(options: DockerCallOptions = {}): Promise<EngineVersion> {
    const result = await this.check(['version', '--format', '{{json .}}'], {timeoutMs: PING_TIMEOUT_MS, ...options})
    const parsed = JSON.parse(result.stdout) as {Server?: {Version?: string; ApiVersion?: string} | null}
    if (!parsed.Server?.Version) throw dockerDown(result.stderr)
    return {server: parsed.Server.Version, api: parsed.Server.ApiVersion ?? 'unknown'}
  }
}

/** What the image pipeline needs of the CLI (its reads may go over the Engine API instead). */
export type DockerExec = Pick<DockerCli, 'exec'>

let defaultCli: DockerCli | undefined

/** The process-wide docker CLI (honours $MEEPAGATEWAY_DOCKER_BIN at first use). */
export function dockerCli(): DockerCli {
  defaultCli ??= new DockerCli()
  return defaultCli
}

function forwardLines(child: Subprocess, onLine: (line: string, stream: 'stdout' | 'stderr') => void): void {
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
