import fs from 'node:fs'
import path from 'node:path'
import {gatewayRunDir} from '../../util/paths.js'
import type {AgentRunOutput} from '../../shapes/agent-run-contract.js'

/**
 * `send` and a running gateway of the same MEEPAGATEWAY_HOME (docs/architecture.md, "send through
 * a running gateway"): one JSON line each way over a unix socket in the home, which no sandbox can
 * reach (the home is denied to every agent), opened only with the token the gateway writes next to it.
 */
export const LOCAL_SEND_VERSION = 1

/** The directory of the socket and its token: the gateway's, mode 0700. */
export function localSendDir(home: string): string {
  return gatewayRunDir(home)
}
export function localSendSocket(home: string): string {
  return path.join(localSendDir(home), 'send.sock')
}
export function localSendToken(home: string): string {
  return path.join(localSendDir(home), 'send.token')
}

/** `send`'s first line: the token, checked before anything else is read (and at most 4 KiB of it). */
export interface LocalSendHello {
  type: 'hello'
  token: string
}

/** `send`'s second line: exactly its one-shot run, or nothing (it then runs it itself). */
export interface LocalSendRequest {
  type: 'send'
  version: number
  /** buildIdentity() (util/build-identity.ts): the code a one-shot `send` would run. */
  build: string
  agent: string
  channel: string
  content: string
  user: {id: string; name: string}
  unrestricted: boolean
  /** The config file `send` would load (absolute). */
  config_path: string
  /** sameRunDigest of the config text and the environment as `send` has them. */
  digest: string
}

/** After the request, `send` may forward a signal it received (Ctrl-C, kill). */
export interface LocalSendSignal {
  type: 'signal'
  signal: 'SIGINT' | 'SIGTERM'
}

export type LocalSendAnswer =
  /** The gateway took the message: from here `send` never runs it itself, whatever happens. */
  | {type: 'accepted'; run_id: string}
  | {type: 'log'; line: string}
  | {type: 'result'; output: AgentRunOutput}
  /**
   * The gateway will not run it as `send` would (another build, config or environment, stopping,
   * busy): `send` runs it.
   */
  | {type: 'declined'; reason: string}
  /** Not the gateway's token: nothing ran. */
  | {type: 'refused'; message: string}

/**
 * Environment variables that change what a run does, besides those the config names: the agent's
 * PATH, HOME and locale, Node's, OpenSSL's and the SDKs' TLS and proxy settings, the Docker client's, ours.
 */
const RUN_ENV =
  /^(?:PATH|HOME|USER|LANG|LANGUAGE|TZ|TMPDIR|LC_\w+|XDG_CONFIG_HOME|XDG_RUNTIME_DIR|NODE_\w+|OPENSSL_\w+|SSL_CERT_\w+|OPENAI_\w+|ANTHROPIC_\w+|DOCKER_\w+|MEEPAGATEWAY_HOME|MEEPAGATEWAY_DOCKER_\w+|MEEPA_RETRY_BASE_MS|MEEPA_SANDBOX_\w+|MEEPA_IN_CONTAINER|(?:HTTPS?|NO|ALL)_PROXY)$/i

/**
 * Whether a variable's value is part of sameRunDigest whatever the config says (SSH_AUTH_SOCK only
 * for a DOCKER_HOST over ssh).
 */
export function shapesRuns(name: string, env: NodeJS.ProcessEnv = {}): boolean {
  return RUN_ENV.test(name) || (name === 'SSH_AUTH_SOCK' && Boolean(env.DOCKER_HOST?.startsWith('ssh://')))
}

/**
 * What a run inherits from the process that starts it besides its environment, which a wrapper
 * around `send` may have set (`unshare -n`, `prlimit`, `systemd-run -p MemoryMax=…`, `sg`, a
 * umask): namespaces, credentials and confinement, limits, cgroup. A gateway started elsewhere
 * differs, and declines.
 */
export function processContext(): string {
  if (process.platform !== 'linux')
    return JSON.stringify([process.getuid?.(), process.getgid?.(), process.getgroups?.(), process.umask()])
  const read = (file: string) => {
    try {
      return fs.readFileSync(file, 'utf8')
    } catch {
      return ''
    }
  }
  const status = read('/proc/self/status')
    .split('\n')
    .filter((line) => /^(Umask|Uid|Gid|Groups|CapEff|CapBnd|NoNewPrivs|Seccomp):/.test(line))
  const namespaces = ['net', 'mnt', 'user', 'pid', 'ipc', 'uts', 'cgroup'].map((name) => {
    try {
      return fs.readlinkSync(`/proc/self/ns/${name}`)
    } catch {
      return name
    }
  })
  return JSON.stringify([status, namespaces, read('/proc/self/limits'), runsCgroup(read('/proc/self/cgroup'))])
}

/**
 * /proc/self/cgroup as it decides where runs go: on cgroup v2 a gateway moves itself into a
 * `meepa-gateway` leaf of its cgroup at its first run (src/sandbox/run-cgroup.ts), as a one-shot
 * `send` from that cgroup would, and the runs of both go beside it.
 */
export function runsCgroup(procSelfCgroup: string): string {
  return procSelfCgroup.replace(/\/meepa-gateway$/gm, '')
}

/**
 * What must be equal for a gateway's run to be the run `send` would make: the config file's text,
 * the value of every variable that shapes a run, including each one the config names (every
 * `$NAME` and `api_key_env` is written in its text), and the process context. Hashed with the
 * token, so no value crosses the socket and nothing can be guessed from the digest without the
 * token. Not a cryptographic hash (node:crypto costs `send` 3 ms to load): it only tells two
 * setups apart, and nobody gains by a collision (the token decides who may ask, and any run it
 * asks for is the operator's).
 */
export function sameRunDigest(
  token: string,
  configText: string,
  env: NodeJS.ProcessEnv,
  context: string = processContext(),
): string {
  const words = new Set(configText.match(/[A-Za-z_][A-Za-z0-9_]*/g) ?? [])
  const pairs = Object.entries(env)
    .filter(([name, value]) => value !== undefined && (shapesRuns(name, env) || words.has(name)))
    .sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0))
  return hash128(JSON.stringify([token, configText, pairs, context]))
}

/** Four 32-bit FNV-1a lanes, each with its own offset, prime and input mix: 128 bits in hex. */
function hash128(text: string): string {
  const lanes = [0x811c9dc5, 0x050c5d1f, 0x9747b28c, 0x2545f491]
  for (let index = 0; index < text.length; index++) {
    const code = text.charCodeAt(index)
    for (let lane = 0; lane < 4; lane++)
      lanes[lane] = Math.imul((lanes[lane] as number) ^ (code + lane * 0x9e37), 0x01000193 + lane * 2)
  }
  return lanes.map((lane) => (lane >>> 0).toString(16).padStart(8, '0')).join('')
}
