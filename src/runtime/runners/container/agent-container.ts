import {SYNC_START_LOG} from '../../agent-run/workspace-changes.js'
import type {DockerCli} from '../../../sandbox/docker/cli.js'
import {LABEL} from '../../../sandbox/docker/dockerfile.js'
import {buildDockerRunArgs, type DockerRunSpec} from '../../../sandbox/docker/run-args.js'
import {redactSecrets} from '../../util/redact.js'
import type {Subprocess} from '../../util/subprocess.js'

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

/** A `docker run -i` of agent-run, whose input goes in on stdin once its message is known. */
export interface AgentContainer {
  name: string
  key: string
  child: Subprocess
  stderrTail: string
  /** Where its stderr lines go: the run it serves (a standby container has none yet). */
  log: (line: string) => void
  /** On a sync engine, the run's start as agent-run first said it (before any command ran). */
  syncSince?: string
}

export function startAgentContainer(
  cli: DockerCli,
  shape: RunShape,
  options: {name: string; run: string; clientTimeoutMs: number},
): AgentContainer {
  const args = buildDockerRunArgs({
    ...shape.spec,
    name: options.name,
    labels: {...shape.spec.labels, [LABEL.run]: options.run},
  })
  const child = cli.spawn(args, {
    openStdin: true,
    streamStdout: true,
    env: shape.cliEnv,
    timeoutMs: options.clientTimeoutMs,
    removeIfOwnerDies: options.name,
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
