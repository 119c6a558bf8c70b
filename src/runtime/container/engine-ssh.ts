import fs from 'node:fs'
import path from 'node:path'
import type {EngineConfig} from '../config/types.js'
import {APP_ROOT} from '../util/app-root.js'

/**
 * How the docker CLI reaches an ssh:// engine (docs/architecture.md, "Engines"), and the gateway a
 * Podman engine's own API there (podman-api.ts). The CLI runs `ssh … docker system dial-stdio` itself and finds `ssh` on its PATH; bin/docker-ssh/ comes first there,
 * and its `ssh` runs the real client with host keys always checked (StrictHostKeyChecking=yes,
 * BatchMode=yes: an unknown or changed key is refused, never accepted or asked about) and the
 * engine's own known_hosts and identity. Only paths travel, in the CLI's environment. Each docker
 * call is one ssh connection (a shared ControlMaster connection held the CLI's pipes open for
 * its persist time: every call then took that long).
 */
export const SSH_WRAPPER_DIR = path.join(APP_ROOT, 'bin', 'docker-ssh')

/**
 * The docker CLI's extra environment for an engine reached over ssh. On a Podman engine the
 * wrapper asks the far side for `podman system dial-stdio` where the CLI asks for docker's: it
 * proxies to that user's Podman service the same way.
 */
export function sshEnvOf(
  engine: Pick<EngineConfig, 'ssh' | 'kind'>,
  searchPath: string = process.env.PATH ?? '/usr/bin:/bin',
): Record<string, string> {
  const {ssh} = engine
  const env: Record<string, string> = {PATH: `${SSH_WRAPPER_DIR}:${searchPath}`}
  const client = sshClientOn(searchPath)
  if (client) env.MEEPA_SSH_CLIENT = client
  if (ssh?.known_hosts) env.MEEPA_SSH_KNOWN_HOSTS = ssh.known_hosts
  if (ssh?.identity) env.MEEPA_SSH_IDENTITY = ssh.identity
  if (engine.kind === 'podman') env.MEEPA_SSH_DIAL = 'podman'
  return env
}

/**
 * The wrapper's argv to reach `host` (ssh://user@host:port) and run `command` there, as the docker
 * CLI builds its own (`-l user -p port -- host command…`).
 */
export function sshArgsOf(host: string, command: string[]): string[] {
  const url = new URL(host)
  return [
    ...(url.username ? ['-l', decodeURIComponent(url.username)] : []),
    ...(url.port ? ['-p', url.port] : []),
    '--',
    url.hostname,
    ...command,
  ]
}

export const SSH_WRAPPER = path.join(SSH_WRAPPER_DIR, 'ssh')

/** The real ssh client: the first on PATH that is not the wrapper itself. */
function sshClientOn(searchPath: string): string | undefined {
  for (const dir of searchPath.split(':')) {
    if (!dir || path.resolve(dir) === SSH_WRAPPER_DIR) continue
    const candidate = path.join(dir, 'ssh')
    try {
      fs.accessSync(candidate, fs.constants.X_OK)
      return candidate
    } catch {
      // not here
    }
  }
  return undefined
}
