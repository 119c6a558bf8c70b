import fs from 'node:fs'
import path from 'node:path'
import {dockerCli, dockerMissing, engineErrorOf, type DockerCli} from '../../sandbox/docker/cli.js'
import {homeLabel, removeContainers} from '../../sandbox/docker/containers.js'
import {CONTAINER_APP, LABEL} from '../../sandbox/docker/dockerfile.js'
import {ensureContainerImage, ensureIsolationImage, planImages, type ImageContext} from '../../sandbox/docker/images.js'
import {buildDockerRunArgs, CONTAINER_WORKSPACE, containerNameFor} from '../../sandbox/docker/run-args.js'
import type {AgentRunOutput} from '../agent-run/contract.js'
import {withAgentLock} from '../agent-lock.js'
import type {AgentConfig, GatewayConfig} from '../config/types.js'
import {DEFAULT_GATEWAY} from '../config/defaults.js'
import {containerImageContext} from '../container-context.js'
import {GatewayError, toGatewayError} from '../errors.js'
import {KeyedQueue} from '../keyed-queue.js'
import {redactSecrets} from '../redact.js'
import {failure, failureFromError, parseAgentRunOutput} from '../agent-run/output.js'
import {helperPath} from '../../sandbox/landlock/helper.js'
import {APP_ROOT} from './agent-run-process.js'
import type {RunRequest, Runner} from './types.js'

/**
 * Container level: one fresh, hardened container per message (DESIGN.md section 4.2), running the
 * same `agent-run` as every level, from the agent's isolation image (built on first use).
 */
export const containerRunner: Runner = {
  level: 'container',
  run: (request) => runInContainer(request),
}

/** One run per agent at a time, different agents side by side up to gateway.max_concurrent_runs. */
const runQueue = new KeyedQueue({concurrency: DEFAULT_GATEWAY.max_concurrent_runs})

const STDERR_TAIL_BYTES = 4096
/** The docker client gets this long past the run's deadline to notice its container died. */
const CLIENT_GRACE_MS = 30_000
const KILL_TIMEOUT_MS = 15_000

export async function runInContainer(request: RunRequest, options: {cli?: DockerCli} = {}): Promise<AgentRunOutput> {
  const cli = options.cli ?? dockerCli()
  const runId = request.input.run_id
  const log = request.onLog ?? ((line: string) => process.stderr.write(`${line}\n`))
  try {
    runQueue.setConcurrency(request.config.gateway.max_concurrent_runs)
    const output = await runQueue.run(
      request.agent.id,
      () => withAgentLock(request.home, request.agent.id, () => runOnce(request, cli, log), {
        signal: request.signal,
        onWait: (pid) => log(`agent ${request.agent.id} is busy with another run (process ${pid}); waiting for it to finish`),
      }),
      {signal: request.signal},
    )
    return redactOutput(output, request)
  } catch (error) {
    return redactOutput(failureFromError(runId, error), request)
  }
}

/**
 * How long a verified isolation image is trusted without checking again. Checking costs a few
 * docker calls per message; within this window a rebuilt base is only picked up a little later
 * (the run still uses whatever the tag points to).
 */
const VERIFIED_IMAGE_TTL_MS = 30_000
const verifiedImages = new Map<string, {tag: string; at: number}>()

/** The isolation image of the agent: its container image and the runtime, each built when missing or stale. */
export async function readyIsolationImage(config: GatewayConfig, agent: AgentConfig, context: ImageContext): Promise<string> {
  const key = JSON.stringify([config.image_config, agent.container_mode.image, context.cacheDir])
  const verified = verifiedImages.get(key)
  if (verified && Date.now() - verified.at < VERIFIED_IMAGE_TTL_MS) return verified.tag
  const plan = await planImages(config, agent, context)
  await ensureContainerImage(plan, context)
  await ensureIsolationImage(plan, context)
  verifiedImages.set(key, {tag: plan.isolationTag, at: Date.now()})
  return plan.isolationTag
}

async function runOnce(request: RunRequest, cli: DockerCli, log: (line: string) => void): Promise<AgentRunOutput> {
  const {input, agent} = request
  const runId = input.run_id
  const image = await readyIsolationImage(request.config, agent, containerImageContext(request.home, {cli, signal: request.signal, onLog: log}))
  const forwardEnv = injectedSecretNames(request.config, input.secrets)
  const name = containerNameFor(runId)
  const args = buildDockerRunArgs({
    name,
    image,
    workspace: canonicalWorkspace(request.workspace),
    uid: process.getuid?.() ?? 1000,
    gid: process.getgid?.() ?? 1000,
    memoryLimit: agent.container_mode.memory_limit,
    pidsLimit: agent.container_mode.pids_limit,
    network: agent.container_mode.network,
    labels: {
      [LABEL.gateway]: '1',
      [LABEL.agent]: agent.id,
      [LABEL.run]: runId,
      [LABEL.home]: homeLabel(request.home),
      [LABEL.pid]: String(process.pid),
    },
    forwardEnv,
    sandboxHelper: bundledSandboxHelper(),
  })

  // Everything the run needs, secrets included, goes in on stdin; forwarded secrets reach the
  // engine through the docker CLI's own environment (`-e NAME` without a value), never argv.
  const child = cli.spawn(args, {
    input: JSON.stringify({...input, workspace: CONTAINER_WORKSPACE, env_secrets: forwardEnv}),
    env: Object.fromEntries(forwardEnv.map((secretName) => [secretName, input.secrets[secretName] ?? ''])),
    timeoutMs: request.timeoutMs + CLIENT_GRACE_MS,
  })
  let stderrTail = ''
  const secretValues = Object.values(input.secrets)
  child.stderr?.on('data', (chunk: Buffer) => {
    const text = chunk.toString('utf8')
    stderrTail = (stderrTail + text).slice(-STDERR_TAIL_BYTES)
    for (const line of text.split('\n')) if (line.trim()) log(redactSecrets(line, secretValues))
  })

  // The deadline kills the container itself: killing only the docker client would leave the
  // agent's processes running inside (and writing to the workspace) after the user was told it stopped.
  let stopped: 'timeout' | 'cancelled' | undefined
  let stopping: Promise<unknown> = Promise.resolve()
  const stop = (reason: 'timeout' | 'cancelled') => {
    if (stopped) return
    stopped = reason
    stopping = cli.exec(['kill', name], {timeoutMs: KILL_TIMEOUT_MS}).catch((error: unknown) => log(`could not kill container ${name}: ${toGatewayError(error).message}`))
  }
  const timer = setTimeout(() => stop('timeout'), request.timeoutMs)
  const onAbort = () => stop('cancelled')
  request.signal?.addEventListener('abort', onAbort, {once: true})
  if (request.signal?.aborted) onAbort()

  let result: Awaited<typeof child>
  try {
    result = await child
  } finally {
    clearTimeout(timer)
    request.signal?.removeEventListener('abort', onAbort)
  }
  await stopping
  // Inspected even after a clean exit: a command the agent ran may have been OOM-killed while
  // agent-run itself carried on, and the user must hear "out of memory", not a puzzled reply.
  const state = await collectContainer(cli, name, log, {awaitRemoval: stopped !== undefined})

  if (result.code === 'ENOENT') throw dockerMissing(cli.bin, cli.binFromEnv)
  if (state?.oomKilled) {
    return failure(runId, 'E_OOM', `the run ran out of memory: its container reached container_mode.memory_limit (${agent.container_mode.memory_limit}) and the kernel killed it`, false, {
      stderr_tail: stderrTail,
      exit_code: state.exitCode,
      suggestions: ['raise container_mode.memory_limit for this agent', 'or ask for a task that needs less memory'],
    })
  }
  if (stopped === 'timeout') {
    return failure(runId, 'E_TIMEOUT', `the run took longer than ${Math.round(request.timeoutMs / 1000)} s (container_mode.timeout_seconds) and its container was killed`, false, {stderr_tail: stderrTail})
  }
  if (stopped === 'cancelled') return failure(runId, 'E_RUN', 'the run was cancelled and its container was killed', true)
  const exitCode = result.exitCode
  if (!state) {
    // The container never existed: docker itself refused (engine down, bad image, name clash).
    const engineError = engineErrorOf(stderrTail)
    if (engineError) throw engineError
    throw new GatewayError('E_DOCKER', `docker run failed before the container started (exit ${exitCode ?? 'unknown'}): ${stderrTail.trim().split('\n').slice(-3).join(' | ')}`, {
      details: {stderr_tail: stderrTail},
    })
  }
  return parseAgentRunOutput(runId, String(result.stdout ?? ''), state.exitCode, stderrTail)
}

/**
 * Reads how the container ended, then removes it; undefined when it was never created. The
 * removal is not waited for: the reply does not depend on it, and the process keeps running
 * until it is done (a container it fails to remove is an orphan for start-up and `container clean`).
 */
async function collectContainer(
  cli: DockerCli,
  name: string,
  log: (line: string) => void,
  options: {awaitRemoval?: boolean} = {},
): Promise<{oomKilled: boolean; exitCode: number} | undefined> {
  let state: {oomKilled: boolean; exitCode: number} | undefined
  try {
    const inspected = await cli.exec(['container', 'inspect', '--format', '{{json .State}}', name])
    if (inspected.exitCode === 0) {
      const raw = JSON.parse(inspected.stdout) as {OOMKilled?: boolean; ExitCode?: number}
      state = {oomKilled: raw.OOMKilled === true, exitCode: raw.ExitCode ?? -1}
    }
  } catch (error) {
    log(`could not inspect container ${name}: ${toGatewayError(error).message}`)
  }
  const removal = scheduleRemoval(cli, name, log)
  // A failed run is not in a hurry, and "nothing left behind" matters most after a kill.
  if (!state || state.exitCode !== 0 || state.oomKilled || options.awaitRemoval) await removal
  return state
}

const pendingRemovals = new Set<Promise<void>>()

function scheduleRemoval(cli: DockerCli, name: string, log: (line: string) => void): Promise<void> {
  const removal = removeContainers(cli, [name]).catch((error: unknown) => {
    log(`could not remove container ${name} (container clean will): ${toGatewayError(error).message}`)
  })
  pendingRemovals.add(removal)
  void removal.finally(() => pendingRemovals.delete(removal))
  return removal
}

/** Resolves when every container this process started has been removed (for shutdown and tests). */
export async function containerRemovalsSettled(): Promise<void> {
  await Promise.all([...pendingRemovals])
}

/**
 * Secrets that are also set in the container's environment: provider keys when
 * image_config.inject_credentials_env, the agent's other secrets when inject_secrets_env.
 * Names the docker CLI itself reads (DOCKER_*, PATH, HOME, ...) are never forwarded: the value
 * would change what the CLI does, not just what the container sees.
 */
export function injectedSecretNames(config: GatewayConfig, secrets: Record<string, string>): string[] {
  const credentials = new Set(Object.values(config.providers.providers).flatMap((provider) => (provider.api_key_env ? [provider.api_key_env] : [])))
  return Object.keys(secrets)
    .filter((name) => (credentials.has(name) ? config.image_config.inject_credentials_env : config.image_config.inject_secrets_env))
    .filter((name) => !/^(DOCKER_|XDG_)/.test(name) && !['PATH', 'HOME', 'USER', 'TMPDIR', 'SSH_AUTH_SOCK'].includes(name) && !/_PROXY$/i.test(name))
    .sort()
}

function canonicalWorkspace(workspace: string): string {
  try {
    return fs.realpathSync(workspace)
  } catch {
    throw new GatewayError('E_WORKSPACE', `the workspace ${workspace} does not exist`, {suggestions: ['run meepagateway agent create, or send a message (it creates the workspace)']})
  }
}

/** With redact_secrets, no secret value leaves the runner: reply, error message and details. */
function redactOutput(output: AgentRunOutput, request: RunRequest): AgentRunOutput {
  if (request.input.redact_secrets === false || Object.keys(request.input.secrets).length === 0) return output
  const scrub = (value: unknown): unknown => {
    if (typeof value === 'string') return redactSecrets(value, request.input.secrets)
    if (Array.isArray(value)) return value.map(scrub)
    if (value && typeof value === 'object') return Object.fromEntries(Object.entries(value).map(([key, item]) => [key, scrub(item)]))
    return value
  }
  return scrub(output) as AgentRunOutput
}

/** The helper's path inside the isolation image, which bundles dist/ (and so the helper, built on Linux). */
function bundledSandboxHelper(): string | undefined {
  return fs.existsSync(helperPath()) ? `${CONTAINER_APP}/${path.relative(APP_ROOT, helperPath())}` : undefined
}
