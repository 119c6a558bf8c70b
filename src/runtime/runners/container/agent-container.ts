import {SYNC_START_LOG} from '../../agent-run/workspace-changes.js'
import type {DockerCli} from '../../../sandbox/docker/cli.js'
import {LABEL} from '../../../sandbox/docker/dockerfile.js'
import {buildCreateRequest, buildDockerRunArgs, type DockerRunSpec} from '../../../sandbox/docker/run-args.js'
import {toGatewayError} from '../../util/errors.js'
import {redactSecrets} from '../../util/redact.js'
import type {Subprocess} from '../../util/subprocess.js'
import {engineApiFor, scheduleRemoval} from './removals.js'

const STDERR_TAIL_BYTES = 4096

/** Everything that decides an agent's `docker run` except its name and run label. */
export interface RunShape {
  spec: Omit<DockerRunSpec, 'name'>
  /** Values of the forwarded secrets, for the docker CLI's environment. */
  cliEnv: Record<string, string>
  /** Hash of all of it (secret values included): a standby container must match it exactly. */
  key: string
}

const SYNC_START = new RegExp(`^\\[agent-run [^\\]]{1,100}\\] ${SYNC_START_LOG} (\\d{1,20})$`)

/** A container of agent-run attached with stdin, whose input goes in once its message is known. */
export interface AgentContainer {
  name: string
  key: string
  child: Subprocess
  stderrTail: string
  /** Where its stderr lines go: the run it serves (a standby container has none yet). */
  log: (line: string) => void
  /** On a sync engine, the run's start as agent-run first said it (before any command ran). */
  syncSince?: string
  /** A standby's: its volume's generation (SyncedVolume) as it started, when it took the workspace's names. */
  syncGeneration?: string
}

/**
 * On the local Docker engine a network-less run's container is created over the Engine API
 * (NetworkDisabled: run-args.ts says why) and started with `docker start -ai`; anywhere else
 * with `docker run -i`. A container whose creation failed is removed (it may exist regardless).
 */
export async function startAgentContainer(
  cli: DockerCli,
  shape: RunShape,
  options: {
    name: string
    run: string
    clientTimeoutMs: number
    /** How long the engine may take to create it (as a `docker run` client would have waited). */
    createTimeoutMs: number
    signal?: AbortSignal
    /** Where what the engine says on creating it goes (a limit it dropped). */
    log: (line: string) => void
  },
): Promise<AgentContainer> {
  const spec = {...shape.spec, name: options.name, labels: {...shape.spec.labels, [LABEL.run]: options.run}}
  const {hostsFile} = spec
  const local =
    hostsFile && spec.network === 'none' && spec.engineKind !== 'podman' && !spec.unappliedLimits?.length
      ? engineApiFor(cli)
      : undefined
  const request = {timeoutMs: options.createTimeoutMs, signal: options.signal}
  // Podman answering Docker's socket would drop the body's Ulimits: it gets docker run's argv
  const api = local && (await local.isDocker(request)) ? local : undefined
  if (api && hostsFile) {
    const warnings = await api
      .createContainer(options.name, buildCreateRequest({...spec, hostsFile}, shape.cliEnv), request)
      .catch((error: unknown) => {
        // a name already taken is another's; anything else may have created it regardless
        if (toGatewayError(error).details.http_status !== 409) void scheduleRemoval(cli, options.name, () => {})
        throw error
      })
    for (const warning of warnings) options.log(`container ${options.name}: WARNING: ${warning}`)
  }
  const child = cli.spawn(api ? ['start', '--attach', '--interactive', options.name] : buildDockerRunArgs(spec), {
    openStdin: true,
    streamStdout: true,
    // the forwarded secrets went in the create body: the client needs none
    env: api ? {} : shape.cliEnv,
    timeoutMs: options.clientTimeoutMs,
    removeIfOwnerDies: options.name,
  })
  // no docker CLI to start it: the created container is nobody's
  if (api)
    void child.then((ended) => {
      if (ended.code === 'ENOENT') void scheduleRemoval(cli, options.name, () => {})
    })
  const container: AgentContainer = {name: options.name, key: shape.key, child, stderrTail: '', log: () => {}}
  const secretValues = Object.values(shape.cliEnv)
  child.stderr?.on('data', (chunk: Buffer) => {
    const text = chunk.toString('utf8')
    container.stderrTail = (container.stderrTail + text).slice(-STDERR_TAIL_BYTES)
    for (const line of text.split('\n')) {
      if (!line.trim()) continue
      container.syncSince ??= SYNC_START.exec(line)?.[1]
      container.log(redactSecrets(line, secretValues))
    }
  })
  return container
}
