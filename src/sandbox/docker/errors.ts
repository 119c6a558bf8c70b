import {GatewayError} from '../../runtime/util/errors.js'
import type {DockerResult} from './cli.js'

/**
 * What the gateway reports when Docker fails, whichever way it was asked (the docker CLI or the
 * Engine API over its socket): the same codes, messages and fixes, so exit codes never depend on
 * the transport. Loads no process library: the Engine API path must stay light.
 */

/** Overrides the docker CLI to use (an absolute path or a name looked up on PATH). */
export const DOCKER_BIN_ENV = 'MEEPAGATEWAY_DOCKER_BIN'

/** A docker call that exited non-zero for a reason other than the engine being unreachable. */
export class DockerCommandError extends GatewayError {
  constructor(
    readonly args: string[],
    readonly result: DockerResult,
  ) {
    super(
      'E_DOCKER',
      `docker ${args[0] ?? ''} failed (exit ${result.exitCode}): ${lastLines(result.stderr || result.stdout, 5)}${createRefusedNote(result.stderr)}`,
      {
        details: {exit_code: result.exitCode, stderr_tail: result.stderr.slice(-4096)},
      },
    )
    this.name = 'DockerCommandError'
  }
}

/** The engine's reason for a refusal in a docker CLI's stderr, in the words the Engine API gives. */
export function cliRefusal(stderr: string): string {
  return lastLines(stderr, 1).replace(/^Error response from daemon: /, '')
}

/** Podman's Docker-compatible API answers the CLI's attach with 409 when its OCI runtime could not create the container. */
const CREATE_REFUSED = /unable to upgrade to tcp, received 409/

/** What a bare "received 409" means and how to see the engine's own reason, or '' for any other failure. */
export function createRefusedNote(stderr: string): string {
  if (!CREATE_REFUSED.test(stderr)) return ''
  return ' (the engine could not create the container: on Podman its OCI runtime failed; `podman run --rm --network none IMAGE true` as the engine\'s user shows why, and crun refuses cgroup v1 hybrid hosts, where runtime = "runc" in its containers.conf works)'
}

export function lastLines(text: string, count: number): string {
  return text.trim().split('\n').slice(-count).join(' | ') || '(no output)'
}

/**
 * The engine-level reason a docker call failed (engine down, no permission), read from the CLI's
 * stderr; undefined when the failure is the command's own (for callers that own the child).
 */
export function engineErrorOf(stderr: string): GatewayError | undefined {
  if (/permission denied while trying to connect/i.test(stderr)) return dockerPermission(stderr)
  if (TLS_REFUSED.test(stderr)) return engineTlsRefused(stderr)
  if (SSH_HOST_KEY_REFUSED.test(stderr)) return sshHostKeyRefused(stderr)
  if (SSH_LOGIN_REFUSED.test(stderr)) return sshLoginRefused(stderr)
  if (ENGINE_UNREACHABLE.test(stderr)) return dockerDown(stderr)
  return undefined
}

const ENGINE_UNREACHABLE =
  /Cannot connect to the Docker daemon|Is the docker daemon running|error during connect|connect: no such file or directory|connect: connection refused|dial unix .*: connect/i

/**
 * The one line of a docker CLI's stderr that says why the engine cannot be reached, in its own
 * words: not the `docker: ` prefix, nor the "See 'docker run --help'" the CLI adds after it.
 */
function unreachableReason(text: string): string {
  const line = text.split('\n').find((candidate) => ENGINE_UNREACHABLE.test(candidate)) ?? lastLines(text, 1)
  return line
    .trim()
    .replace(/^docker: /, '')
    .replace(/\?\.$/, '?')
}

export function dockerMissing(bin: string, fromEnv: boolean): GatewayError {
  return new GatewayError(
    'E_DOCKER_MISSING',
    fromEnv
      ? `the docker CLI was not found at ${DOCKER_BIN_ENV}=${bin}`
      : `the docker CLI (${bin}) was not found${bin.includes('/') ? '' : ' on PATH'}`,
    {
      suggestions: [
        'install Docker (Debian/Ubuntu: apt-get install docker.io; macOS: Docker Desktop or colima)',
        `or point ${DOCKER_BIN_ENV} at the docker executable`,
        'or turn container_mode off for the agent',
      ],
    },
  )
}

/** The CLI's words when mutual TLS with an engine failed (either side refused the other's certificate). */
const TLS_REFUSED = /x509:|tls: |remote error: tls|certificate (is not valid|signed by unknown)/i

/** Mutual TLS failed: the engine is not the one the CA vouches for, or it refused this client's certificate. */
function engineTlsRefused(stderr: string): GatewayError {
  const line = stderr.split('\n').find((candidate) => TLS_REFUSED.test(candidate)) ?? lastLines(stderr, 1)
  return new GatewayError(
    'E_DOCKER_DOWN',
    `the engine's TLS handshake failed, so it is not used: ${line.trim().replace(/^docker: /, '')}`,
    {
      retryable: true,
      suggestions: [
        "the engine's server certificate must be signed by the CA in engines[].tls.ca and name the host in engines[].host",
        'the engine (dockerd --tlsverify --tlscacert) must trust the CA that signed engines[].tls.cert',
      ],
    },
  )
}

/** ssh's words when the engine's host key is not the known one, or none is known (strict checking is always on). */
const SSH_HOST_KEY_REFUSED = /Host key verification failed/
const SSH_LOGIN_REFUSED = /Permission denied \((publickey|password|keyboard-interactive)[^)]*\)/

/** An ssh:// engine whose host key is unknown or changed: never used, whatever the ssh config says. */
function sshHostKeyRefused(stderr: string): GatewayError {
  const changed = /HOST IDENTIFICATION HAS CHANGED|has changed and you have requested strict checking/.test(stderr)
  const host = /(?:known for|Host key for) (\S+)/.exec(stderr)?.[1] ?? 'the engine'
  return new GatewayError(
    'E_DOCKER_DOWN',
    changed
      ? `the ssh host key of ${host} does not match the known one: someone may be intercepting the connection, so the engine is not used`
      : `the ssh host key of ${host} is not known, so the engine is not used (host keys are always checked)`,
    {
      retryable: true,
      suggestions: changed
        ? [
            "if the host was reinstalled, check its new key's fingerprint there (ssh-keygen -lf /etc/ssh/ssh_host_ed25519_key.pub), then replace its line in engines[].ssh.known_hosts (or ~/.ssh/known_hosts): ssh-keygen -R HOST -f FILE",
          ]
        : [
            "add the host's key to engines[].ssh.known_hosts (or ~/.ssh/known_hosts): ssh-keyscan -p PORT HOST >> FILE, after checking its fingerprint on the host (ssh-keygen -lf /etc/ssh/ssh_host_ed25519_key.pub)",
          ],
    },
  )
}

/** The ssh server refused the gateway's login: a key it does not accept, or none given. */
function sshLoginRefused(stderr: string): GatewayError {
  const line = stderr.split('\n').find((candidate) => SSH_LOGIN_REFUSED.test(candidate)) ?? lastLines(stderr, 1)
  return new GatewayError(
    'E_DOCKER_DOWN',
    `the engine's ssh server refused the login: ${line.trim().replace(/^.*stderr=/, '')}`,
    {
      retryable: true,
      suggestions: [
        "name the private key in engines[].ssh.identity (no passphrase, or one held by ssh-agent) and add its public key to the engine user's ~/.ssh/authorized_keys",
      ],
    },
  )
}

/** `reason`: the CLI's stderr, or what connecting to the socket said. */
export function dockerDown(reason: string): GatewayError {
  const host = process.env.DOCKER_HOST
  return new GatewayError(
    'E_DOCKER_DOWN',
    `the Docker engine is not running or not reachable${host ? ` at DOCKER_HOST=${host}` : ''}: ${unreachableReason(reason)}`,
    {
      retryable: true,
      suggestions: [
        'start the engine: sudo systemctl start docker (Docker Desktop: open the app)',
        host
          ? `check DOCKER_HOST=${host}, or unset it to use the default socket`
          : 'check `docker info` works for this user',
      ],
    },
  )
}

/** `request`: what went unanswered, e.g. "`docker ps`" or "GET /containers/json". */
export function dockerHung(request: string, timeoutMs: number): GatewayError {
  return new GatewayError(
    'E_DOCKER_HUNG',
    `the Docker engine did not answer ${request} within ${Math.round(timeoutMs / 1000)} s; it seems hung`,
    {
      retryable: true,
      suggestions: [
        'restart the engine: sudo systemctl restart docker (Docker Desktop: restart it)',
        'check `timeout 10 docker info`, and the engine log (journalctl -u docker)',
      ],
    },
  )
}

/** `reason`: the CLI's stderr, or what connecting to the socket said. */
export function dockerPermission(reason: string): GatewayError {
  return new GatewayError('E_DOCKER', `this user may not use the Docker engine: ${lastLines(reason, 1)}`, {
    suggestions: [
      'add the user to the docker group (sudo usermod -aG docker $USER, then log in again)',
      'or run the gateway as a user that may use Docker',
    ],
  })
}

/** A call stopped by its AbortSignal (the caller gave up; the engine may be fine). */
export function dockerCancelled(request: string): GatewayError {
  return new GatewayError('E_DOCKER', `${request} was cancelled`, {retryable: true})
}

/**
 * `engine` ("the Docker engine at unix:///…", "Podman engine pod") sent more than a call collects:
 * the connection was cut (or its ssh ended) rather than the answer held until the deadline.
 */
export function engineAnswerTooLarge(engine: string, request: string, maxBytes: number): GatewayError {
  return new GatewayError(
    'E_DOCKER',
    `${engine} sent more than ${maxBytes / (1024 * 1024)} MiB in answer to ${request}, so the connection was cut: no engine answers that much, so what answers there is not a working engine`,
    {
      retryable: true,
      suggestions: [
        "check that the engine's host points at a Docker or Podman API (its /_ping answers OK, in a few bytes)",
        'restart the engine if it is one: sudo systemctl restart docker (Podman: systemctl --user restart podman.socket)',
      ],
    },
  )
}
