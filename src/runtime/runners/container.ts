import fs from 'node:fs'
import {setTimeout as sleep} from 'node:timers/promises'
import path from 'node:path'
import {dockerCli, type DockerCli} from '../../sandbox/docker/cli.js'
import {dockerMissing, engineErrorOf} from '../../sandbox/docker/errors.js'
import {localEngineApi} from '../../sandbox/docker/engine-api.js'
import {homeLabel, removeContainers} from '../../sandbox/docker/containers.js'
import {CONTAINER_APP, LABEL, sha256} from '../../sandbox/docker/dockerfile.js'
import {ensureContainerImage, ensureIsolationImage, planImages, type ImageContext} from '../../sandbox/docker/images.js'
import {buildDockerRunArgs, CONTAINER_WORKSPACE, containerNameFor, type DockerRunSpec} from '../../sandbox/docker/run-args.js'
import type {AgentRunOutput} from '../agent-run/contract.js'
import {withAgentLock} from '../workspace/agent-lock.js'
import {handWorkspaceTo} from '../workspace/owner.js'
import type {AgentConfig, GatewayConfig} from '../config/types.js'
import {DEFAULT_GATEWAY} from '../config/defaults.js'
import {randomHex} from '../util/random.js'
import {containerImageContext} from '../container/context.js'
import {GatewayError, toGatewayError} from '../util/errors.js'
import {KeyedQueue} from '../util/keyed-queue.js'
import {redactSecrets} from '../util/redact.js'
import {signalChild, type Subprocess} from '../util/subprocess.js'
import {failure, failureFromError, outOfMemory, parseAgentRunOutput} from '../agent-run/output.js'
import {helperPath} from '../../sandbox/landlock/helper-path.js'
import {APP_ROOT} from '../util/app-root.js'
import {dockerEngineProblem, reportEngineAnswered, reportEngineProblem} from './engine-health.js'
import {forgetRunProcess, recordRunProcess} from './run-processes.js'
import {sizeBytes} from '../config/size.js'
import {diskFull, diskUsage, watchDiskUsage} from './disk-limit.js'
import {cappedLog} from './agent-run-process.js'
import type {RunRequest, Runner} from './types.js'
import {AgentRunChannel} from './llm-channel.js'
import {DeadlineWatch} from './deadline-watch.js'
import {setKeeperDeadline} from '../../sandbox/keeper.js'
import type {Duplex} from 'node:stream'

/**
 * Container level: one fresh, hardened container per message (docs/isolation.md), running the
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
/**
 * How long `docker kill` (and then the client's exit) may take before the engine counts as hung
 * and the docker client is killed instead: a run must end within its timeout + 5 s whatever the engine does.
 */
const KILL_TIMEOUT_MS = 2_000
/** After a kill the engine answered, how long the docker client may take to notice its container died. */
const CLIENT_EXIT_AFTER_KILL_MS = 3_000
/** Past the deadline, how long image checks may go on before the engine is asked whether it still answers. */
const ENGINE_PING_TIMEOUT_MS = 3_000

/** What the user and the operator are told when the engine stopped answering during a run. */
export const ENGINE_HUNG_MESSAGE = 'the Docker engine did not answer; the container may still be running and will be removed when the engine answers'
/** Said of a run whose engine died under it: its commands may have done part of their work. */
const PARTLY_RAN = 'the run may have partly run (its commands may have changed files in the workspace)'
/**
 * Past the deadline, when the gateway could not stop the container (it was stopped itself, or
 * the engine does not answer): agent-run ends itself after this much more (the container's init
 * exits with it), and the keeper, after CONTAINER_KEEPER_MARGIN_MS, kills the docker client and
 * removes the container.
 */
const CONTAINER_SELF_DEADLINE_MARGIN_MS = 2_000
const CONTAINER_KEEPER_MARGIN_MS = KILL_TIMEOUT_MS + CLIENT_EXIT_AFTER_KILL_MS

export async function runInContainer(request: RunRequest, options: {cli?: DockerCli} = {}): Promise<AgentRunOutput> {
  const cli = options.cli ?? dockerCli()
  const runId = request.input.run_id
  const log = request.onLog ?? ((line: string) => process.stderr.write(`${line}\n`))
  try {
    runQueue.setConcurrency(request.config.gateway.max_concurrent_runs)
    // In a running gateway the reply goes out when agent-run sends its result; the run keeps its
    // slot and the agent's lock until its container has exited (its teardown, ~100 ms, is not the
    // user's wait). `send` waits for the exit: the process ends after the reply.
    let answer: (output: AgentRunOutput) => void = () => {}
    const answered = new Promise<AgentRunOutput>((resolve) => {
      if (request.standby) answer = resolve
    })
    const whole = runQueue.run(
      request.agent.id,
      () => withAgentLock(request.home, request.agent.id, () => runOnce(request, cli, log, answer), {
        signal: request.signal,
        onWait: (pid) => log(`agent ${request.agent.id} is busy with another run (process ${pid}); waiting for it to finish`),
      }),
      {signal: request.signal},
    )
    void track(pendingRemovals, whole.then(() => {}, () => {}))
    const output = await Promise.race([answered, whole])
    // a hung engine would only leave one more docker client hanging
    if (request.standby && request.agent.container_mode.standby && !dockerEngineProblem()) {
      void track(preparingStandbys, prepareStandby(request, cli).catch((error: unknown) => log(`could not start a standby container: ${toGatewayError(error).message}`)))
    }
    return output
  } catch (error) {
    const failed = toGatewayError(error)
    if (failed.code === 'E_DOCKER_DOWN' || failed.code === 'E_DOCKER_HUNG') {
      // /healthz says "engine down" until the engine answers again
      reportEngineProblem(failed.message.split('\n')[0] ?? failed.code)
      watchEngine(cli)
    }
    return failureFromError(runId, error)
  }
}

/**
 * How long a verified isolation image is trusted without checking again. Checking costs a few
 * docker calls per message; within this window a rebuilt base is only picked up a little later
 * (the run still uses whatever the tag points to).
 */
const VERIFIED_IMAGE_TTL_MS = 30_000
const verifiedImages = new Map<string, {image: ReadyImage; at: number}>()

export interface ReadyImage {
  tag: string
  /** The image the tag points to now: a standby started from an older one is not used. */
  id: string
}

/** The isolation image of the agent: its container image and the runtime, each built when missing or stale. */
export async function readyIsolationImage(config: GatewayConfig, agent: AgentConfig, context: ImageContext): Promise<ReadyImage> {
  const key = JSON.stringify([config.image_config, agent.container_mode.image, context.cacheDir])
  const verified = verifiedImages.get(key)
  if (verified && Date.now() - verified.at < VERIFIED_IMAGE_TTL_MS) return verified.image
  const plan = await planImages(config, agent, context)
  await ensureContainerImage(plan, context)
  const {id} = await ensureIsolationImage(plan, context)
  const image = {tag: plan.isolationTag, id}
  verifiedImages.set(key, {image, at: Date.now()})
  return image
}

/** The engine's API (no docker process) when the run uses the default docker CLI on a local engine; an injected CLI does everything. */
const engineApiFor = (cli: DockerCli) => (cli === dockerCli() ? localEngineApi() : undefined)

/** Image checks over the engine's API where there is one (see engineApiFor). */
function imageContextFor(home: string, cli: DockerCli, options: {signal: AbortSignal; onLog?: (line: string) => void}): ImageContext {
  return containerImageContext(home, {cli, ...options, engine: engineApiFor(cli)})
}

async function runOnce(request: RunRequest, cli: DockerCli, log: (line: string) => void, onAnswer: (output: AgentRunOutput) => void = () => {}): Promise<AgentRunOutput> {
  const {input, agent} = request
  const runId = input.run_id
  const diskLimit = sizeBytes(agent.limits.disk, 'limits.disk')
  const usageBefore = await diskUsage([request.workspace])
  if (usageBefore > diskLimit) return diskFull(runId, agent.limits.disk, usageBefore, request.workspace, 'before')
  await removeOwedContainers(cli)
  const deadline = Date.now() + request.timeoutMs
  const image = await readyBeforeDeadline(cli, deadline, request.signal, (signal) => readyIsolationImage(request.config, agent, imageContextFor(request.home, cli, {signal, onLog: log})))
  const shape = runShape(request, image)
  const standby = takeStandby(standbySlot(request), shape.key)
  if (standby) log(`running in standby container ${standby.name}, started before this message arrived`)
  const container = standby ?? startAgentContainer(cli, shape, {name: containerNameFor(runId), run: runId, clientTimeoutMs: request.timeoutMs + CLIENT_GRACE_MS})
  container.log = cappedLog(log)
  const {name, child} = container
  // the keeper removes the container if this process dies; the record covers the keeper dying too
  recordRunProcess(request.home, {runId, keeperPid: child.pid, cgroups: [], container: name}, log)
  request.onStarted?.()
  // limits.disk: the workspace is a bind mount, measured from here (see disk-limit.ts)
  let diskOver = false
  const diskWatch = watchDiskUsage([request.workspace], diskLimit, () => {
    diskOver = true
    void cli.exec(['kill', name], {timeoutMs: KILL_TIMEOUT_MS}).catch(() => {})
  })
  try {
    const output = await runInStartedContainer(request, cli, container, shape.spec.forwardEnv, onAnswer, Boolean(standby))
    const atEnd = await diskWatch.stop()
    return diskOver || atEnd.over ? diskFull(runId, agent.limits.disk, atEnd.usage, request.workspace, 'during') : output
  } finally {
    void diskWatch.stop()
    forgetRunProcess(request.home, runId)
  }
}

async function runInStartedContainer(
  request: RunRequest,
  cli: DockerCli,
  container: AgentContainer,
  forwardEnv: string[],
  onAnswer: (output: AgentRunOutput) => void,
  /** A standby: its container was already running when the message came. */
  fromStandby = false,
): Promise<AgentRunOutput> {
  const {input, agent} = request
  const runId = input.run_id
  const log = container.log
  const {name, child} = container
  // The input goes in on stdin, then the LLM channel runs over the same pipe; forwarded secrets
  // reach the engine through the docker CLI's own environment (`-e NAME` without a value), never argv.
  let channelBroken = false
  const channel = new AgentRunChannel(
    child.stdin!,
    child.stdout!,
    {...input, workspace: CONTAINER_WORKSPACE, env_secrets: forwardEnv, timeout_ms: request.timeoutMs + CONTAINER_SELF_DEADLINE_MARGIN_MS},
    request.llm,
    () => {
      channelBroken = true
      stop('violation')
    },
    () => {
      if (!stopped) onAnswer(channel.outcome()!)
    },
  )

  // The deadline kills the container itself: killing only the docker client would leave the
  // agent's processes running inside (and writing to the workspace) after the user was told it stopped.
  // When the engine does not answer the kill, the docker client is killed instead, so the run
  // still ends on time; the container is then removed once the engine answers again.
  let stopped: 'timeout' | 'cancelled' | 'violation' | undefined
  let engineSilent = false
  let stopping: Promise<unknown> = Promise.resolve()
  function stop(reason: 'timeout' | 'cancelled' | 'violation') {
    if (stopped) return
    stopped = reason
    stopping = (async () => {
      const answered = await cli.exec(['kill', name], {timeoutMs: KILL_TIMEOUT_MS}).then(
        () => true,
        (error: unknown) => {
          log(`could not kill container ${name}: ${toGatewayError(error).message}`)
          return false
        },
      )
      const exited = await Promise.race([child.then(() => true), sleep(answered ? CLIENT_EXIT_AFTER_KILL_MS : 0, false, {ref: false})])
      if (!exited) {
        engineSilent = true
        signalChild(child, 'SIGKILL')
      }
    })()
  }
  // counted from here: a first build of the image (the engine answering) is not the run's time
  const containerStarted = Date.now()
  const deadline = new DeadlineWatch(request.timeoutMs, () => stop('timeout'))
  // fd 3 of a docker client under its keeper (cli.spawn): the keeper's lifeline
  const lifeline = child.stdio[3] as Duplex | undefined
  if (lifeline) setKeeperDeadline(lifeline, request.timeoutMs + CONTAINER_KEEPER_MARGIN_MS)
  const onAbort = () => stop('cancelled')
  request.signal?.addEventListener('abort', onAbort, {once: true})
  if (request.signal?.aborted) onAbort()

  let result: Awaited<typeof child>
  try {
    result = await child
    await channel.settled()
  } finally {
    deadline.stop()
    request.signal?.removeEventListener('abort', onAbort)
    channel.close()
  }
  await stopping
  const stderrTail = container.stderrTail
  const answer = channel.outcome()
  if (stopped === 'timeout' && deadline.suspendedMs !== undefined && answer) {
    // it answered while this process was stopped, the deadline passing meanwhile: the answer stands
    scheduleRemoval(cli, name, log)
    return answer
  }
  if (result.code === 'ENOENT') throw dockerMissing(cli.bin, cli.binFromEnv)
  if (result.exitCode === 0 && !stopped) {
    // agent-run answered, and itself reported any command the kernel killed for memory: the
    // container only needs removing, which the reply does not wait for.
    scheduleRemoval(cli, name, log)
    reportEngineAnswered()
    return channel.outcome() ?? parseAgentRunOutput(runId, '', 0, stderrTail)
  }
  if (channelBroken) {
    scheduleRemoval(cli, name, log)
    return channel.outcome()!
  }
  if (engineSilent) {
    reportEngineProblem(`a run's container could not be stopped: ${ENGINE_HUNG_MESSAGE}`)
    log(`container ${name}: ${ENGINE_HUNG_MESSAGE}`)
    removeWhenEngineAnswers(cli, name, log)
    const why =
      stopped !== 'timeout'
        ? 'the run was cancelled and '
        : deadline.suspendedMs === undefined
          ? `the run took longer than ${Math.round(request.timeoutMs / 1000)} s (container_mode.timeout_seconds) and `
          : 'the run reached its deadline while the gateway was stopped (suspended), and '
    return failure(runId, 'E_DOCKER_HUNG', `${why}${ENGINE_HUNG_MESSAGE}; ${PARTLY_RAN}`, true, {stderr_tail: stderrTail, partly_ran: true})
  }
  // what is left of the run's timeout + 5 s, at least 3 s: a busy engine is not a hung one
  const state = await collectContainer(cli, name, log, Math.max(3_000, containerStarted + request.timeoutMs + 5_000 - Date.now()))
  if (state === 'engine-lost') {
    // docker run could not reach the engine at all: nothing was started (agent-run never spoke, and no standby was waiting)
    const engineError = fromStandby || channel.spoke ? undefined : engineErrorOf(stderrTail)
    if (engineError) throw engineError
    // the container existed (it was started) but the engine went away before saying how it ended
    return failure(runId, 'E_DOCKER_DOWN', `the Docker engine stopped answering during the run (docker run exit ${result.exitCode ?? 'unknown'}); ${PARTLY_RAN}; the container may still be running and will be removed when the engine answers, before anything else starts there`, true, {stderr_tail: stderrTail, partly_ran: true})
  }
  if (state?.oomKilled) return outOfMemory(runId, agent.container_mode.memory_limit, {stderr_tail: stderrTail, exit_code: state.exitCode})
  if (stopped === 'timeout') {
    return deadline.failure(runId, (seconds) => `the run took longer than ${seconds} s (container_mode.timeout_seconds) and its container was killed`, {stderr_tail: stderrTail})
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
  return channel.outcome() ?? parseAgentRunOutput(runId, '', state.exitCode, stderrTail)
}

/** Everything that decides an agent's `docker run` except its name and run label. */
interface RunShape {
  spec: Omit<DockerRunSpec, 'name'>
  /** Values of the forwarded secrets, for the docker CLI's environment. */
  cliEnv: Record<string, string>
  /** Hash of all of it (secret values included): a standby container must match it exactly. */
  key: string
}

function runShape(request: RunRequest, image: ReadyImage): RunShape {
  const {agent, input} = request
  const forwardEnv = injectedSecretNames(request.config, input.secrets)
  const cliEnv = Object.fromEntries(forwardEnv.map((secretName) => [secretName, input.secrets[secretName] ?? '']))
  const workspace = canonicalWorkspace(request.workspace)
  const user = containerUser(agent.container_mode.user)
  // every run: the gateway and host-sandbox runs may have added files as root since the last one
  if (user.uid !== 0) handWorkspaceTo(workspace, user, {purpose: 'the container'})
  const spec: RunShape['spec'] = {
    // By id: the agent-run verified for this gateway's build, even if another build retags the image meanwhile
    // (an agent-run of another build may not speak this runner's LLM channel).
    image: image.id,
    workspace,
    uid: user.uid,
    gid: user.gid,
    memoryLimit: agent.container_mode.memory_limit,
    pidsLimit: agent.container_mode.pids_limit,
    fileSizeLimit: sizeBytes(agent.limits.disk, 'limits.disk'),
    cpus: agent.container_mode.cpus,
    network: agent.container_mode.network,
    listen: agent.file_access.allow_listen ? 'allow' : 'deny',
    labels: {
      [LABEL.gateway]: '1',
      [LABEL.agent]: agent.id,
      [LABEL.home]: homeLabel(request.home),
      [LABEL.pid]: String(process.pid),
    },
    forwardEnv,
    sandboxHelper: bundledSandboxHelper(),
  }
  return {spec, cliEnv, key: sha256(JSON.stringify([spec, image.id, cliEnv, request.timeoutMs]))}
}

/** A `docker run -i` of agent-run, whose input goes in on stdin once its message is known. */
interface AgentContainer {
  name: string
  key: string
  child: Subprocess
  stderrTail: string
  /** Where its stderr lines go: the run it serves (a standby container has none yet). */
  log: (line: string) => void
}

function startAgentContainer(
  cli: DockerCli,
  shape: RunShape,
  options: {name: string; run: string; clientTimeoutMs: number},
): AgentContainer {
  const args = buildDockerRunArgs({...shape.spec, name: options.name, labels: {...shape.spec.labels, [LABEL.run]: options.run}})
  const child = cli.spawn(args, {openStdin: true, streamStdout: true, env: shape.cliEnv, timeoutMs: options.clientTimeoutMs, removeIfOwnerDies: options.name})
  const container: AgentContainer = {name: options.name, key: shape.key, child, stderrTail: '', log: () => {}}
  const secretValues = Object.values(shape.cliEnv)
  child.stderr?.on('data', (chunk: Buffer) => {
    const text = chunk.toString('utf8')
    container.stderrTail = (container.stderrTail + text).slice(-STDERR_TAIL_BYTES)
    for (const line of text.split('\n')) if (line.trim()) container.log(redactSecrets(line, secretValues))
  })
  return container
}

/**
 * Standby containers: after a gateway's run, the agent's next container is started at once and
 * waits, agent-run loaded, for its message, which then skips container and Node start-up. Each
 * still serves exactly one message. One per agent, discarded when the run's shape changes
 * (config, image, secrets), after STANDBY_IDLE_MS without a message, and when the gateway stops.
 */
const STANDBY_IDLE_MS = 10 * 60_000
const standbys = new Map<string, {container: AgentContainer; cli: DockerCli; expiry: NodeJS.Timeout}>()
/** Standbys still being started: stopping must wait for them, or one would outlive the gateway. */
const preparingStandbys = new Set<Promise<void>>()

function standbySlot(request: RunRequest): string {
  return `${homeLabel(request.home)}/${request.agent.id}`
}

function takeStandby(slot: string, key: string): AgentContainer | undefined {
  const entry = removeStandby(slot)
  if (entry && entry.container.key === key && entry.container.child.exitCode === null) return entry.container
  if (entry) discard(entry)
  return undefined
}

/** Takes a slot's standby out of the pool (to use or discard it). */
function removeStandby(slot: string): {container: AgentContainer; cli: DockerCli} | undefined {
  const entry = standbys.get(slot)
  if (!entry) return undefined
  standbys.delete(slot)
  clearTimeout(entry.expiry)
  return entry
}

/** How long a discarded standby's docker client may take to exit before it is killed. */
const DISCARD_CLIENT_WAIT_MS = 10_000

/**
 * Removed at once (which stops it), and again once its docker client has exited: a container
 * the engine was still creating when the first removal ran would otherwise outlive the gateway.
 */
function discard({container, cli}: {container: AgentContainer; cli: DockerCli}): void {
  container.child.stdin?.destroy()
  discarding.add(container)
  void track(
    pendingRemovals,
    (async () => {
      await scheduleRemoval(cli, container.name, () => {})
      const exited = await Promise.race([container.child.then(() => true), sleep(DISCARD_CLIENT_WAIT_MS, false, {ref: false})])
      if (!exited) signalChild(container.child, 'SIGKILL')
      if (!owedRemovals.has(container.name)) await scheduleRemoval(cli, container.name, () => {})
    })().finally(() => discarding.delete(container)),
  )
}

/** Discarded standbys whose docker client may still be running (killed when shutdown cannot wait). */
const discarding = new Set<AgentContainer>()
/** Those of them a stop already gave up on (the engine did not answer): not waited for again. */
const givenUp = new WeakSet<AgentContainer>()
/** Aborts image checks of standbys still being prepared when the gateway stops. */
let standbyPreparation = new AbortController()
/** Aborts the removals in flight when stopping cannot wait for a hung engine (their docker clients would hold the exit). */
let giveUp = new AbortController()

async function prepareStandby(request: RunRequest, cli: DockerCli): Promise<void> {
  const slot = standbySlot(request)
  if (standbys.has(slot)) return
  const image = await readyIsolationImage(request.config, request.agent, imageContextFor(request.home, cli, {signal: standbyPreparation.signal}))
  if (standbys.has(slot) || standbyPreparation.signal.aborted) return
  const shape = runShape(request, image)
  const name = containerNameFor(`standby_${randomHex(8)}`)
  const container = startAgentContainer(cli, shape, {name, run: 'standby', clientTimeoutMs: STANDBY_IDLE_MS + request.timeoutMs + CLIENT_GRACE_MS})
  const discardIfWaiting = () => {
    if (standbys.get(slot)?.container === container) discard(removeStandby(slot)!)
  }
  // One that ends on its own (engine restart, killed) is only removed: the next run starts cold.
  void container.child.then(discardIfWaiting)
  const expiry = setTimeout(discardIfWaiting, STANDBY_IDLE_MS)
  expiry.unref()
  standbys.set(slot, {container, cli, expiry})
}

/** How long stopping the standbys may wait for the engine before their docker clients are killed. */
const STOP_STANDBYS_TIMEOUT_MS = 3_000

/**
 * Removes every standby container of this process (gateway shutdown, tests) and waits for the
 * removals, at most `timeoutMs`: a hung engine must not hold the shutdown. Returns the names of
 * containers left for the next start-up (it removes containers whose owner is gone).
 */
export async function stopStandbyContainers(options: {timeoutMs?: number} = {}): Promise<string[]> {
  const timeoutMs = options.timeoutMs ?? STOP_STANDBYS_TIMEOUT_MS
  // an earlier call is already removing (or gave up on) the rest
  if (standbys.size === 0 && preparingStandbys.size === 0 && [...discarding].every((container) => givenUp.has(container))) return []
  const preparation = standbyPreparation
  const stopping = (async () => {
    await Promise.race([Promise.all([...preparingStandbys]), sleep(timeoutMs, undefined, {ref: false})])
    preparation.abort()
    for (const slot of [...standbys.keys()]) discard(removeStandby(slot)!)
    await containerRemovalsSettled()
  })()
  const done = await Promise.race([stopping.then(() => true), sleep(timeoutMs, false, {ref: false})])
  standbyPreparation = new AbortController()
  if (done) return []
  const left = [...discarding].map((container) => container.name)
  for (const container of discarding) {
    signalChild(container.child, 'SIGKILL')
    givenUp.add(container)
  }
  giveUp.abort()
  giveUp = new AbortController()
  return [...new Set([...left, ...owedRemovals.keys()])]
}

/**
 * How a container that did not answer ended (OOMKilled, exit code), then removed: undefined when
 * it was never created. Waits for the removal: "nothing left behind" matters most after a kill.
 */
async function collectContainer(cli: DockerCli, name: string, log: (line: string) => void, timeoutMs: number): Promise<{oomKilled: boolean; exitCode: number} | 'engine-lost' | undefined> {
  let state: {oomKilled: boolean; exitCode: number} | undefined
  try {
    const inspected = await cli.exec(['container', 'inspect', '--format', '{{json .State}}', name], {timeoutMs})
    if (inspected.exitCode === 0) {
      const raw = JSON.parse(inspected.stdout) as {OOMKilled?: boolean; ExitCode?: number}
      state = {oomKilled: raw.OOMKilled === true, exitCode: raw.ExitCode ?? -1}
    }
  } catch (error) {
    const message = toGatewayError(error).message
    log(`could not inspect container ${name}: ${message}`)
    reportEngineProblem(message)
    removeWhenEngineAnswers(cli, name, log)
    return 'engine-lost'
  }
  await scheduleRemoval(cli, name, log)
  return state
}

const pendingRemovals = new Set<Promise<void>>()

function scheduleRemoval(cli: DockerCli, name: string, log: (line: string) => void): Promise<void> {
  return track(
    pendingRemovals,
    removeContainers(engineApiFor(cli) ?? cli, [name], giveUp.signal).catch((error: unknown) => {
      log(`could not remove container ${name} (retrying until the engine answers): ${toGatewayError(error).message}`)
      removeWhenEngineAnswers(cli, name, log)
    }),
  )
}

/** How often removals that failed (engine down or hung) are tried again while this process runs. */
const REMOVAL_RETRY_MS = 2_000
const REMOVAL_RETRY_TIMEOUT_MS = 10_000
/** Containers whose removal is owed, by name: retried in the background until the engine answers. */
const owedRemovals = new Map<string, {cli: DockerCli; log: (line: string) => void}>()
let removalRetry: NodeJS.Timeout | undefined

function removeWhenEngineAnswers(cli: DockerCli, name: string, log: (line: string) => void): void {
  owedRemovals.set(name, {cli, log})
  watchEngine(cli)
}

/** Keeps asking the engine (owed removals first, else `docker version`) until it answers again. */
function watchEngine(cli: DockerCli): void {
  removalRetry ??= setTimeout(() => void retryOwedRemovals(cli), REMOVAL_RETRY_MS).unref()
}

/** Removes one owed container; throws while the engine does not answer. */
async function removeOwed(name: string, owed: {cli: DockerCli; log: (line: string) => void}, timeoutMs: number): Promise<void> {
  await removeContainers(owed.cli, [name], AbortSignal.any([AbortSignal.timeout(timeoutMs), giveUp.signal]))
  owedRemovals.delete(name)
  reportEngineAnswered()
  owed.log(`the Docker engine answers again: removed container ${name}`)
}

/** One pass over the owed removals; the engine answering at all clears the problem /healthz shows. */
async function retryOwedRemovals(cli: DockerCli): Promise<void> {
  for (const [name, owed] of [...owedRemovals]) {
    try {
      await removeOwed(name, owed, REMOVAL_RETRY_TIMEOUT_MS)
    } catch {
      break // still no answer: the next pass tries again
    }
  }
  if (owedRemovals.size === 0 && dockerEngineProblem()) {
    const answers = await cli.exec(['version', '--format', '{{.Server.Version}}'], {timeoutMs: ENGINE_PING_TIMEOUT_MS}).then((result) => result.exitCode === 0, () => false)
    if (answers) reportEngineAnswered()
  }
  removalRetry = undefined
  if (owedRemovals.size > 0 || dockerEngineProblem()) watchEngine(cli)
}

/**
 * Before a run starts a container: what an earlier run left when its engine died or hung is
 * removed first, so it cannot go on working beside the new run. E_DOCKER_DOWN while it cannot be.
 */
async function removeOwedContainers(cli: DockerCli): Promise<void> {
  for (const [name, owed] of [...owedRemovals]) {
    try {
      await removeOwed(name, owed, ENGINE_PING_TIMEOUT_MS)
    } catch (error) {
      watchEngine(cli)
      throw new GatewayError('E_DOCKER_DOWN', `container ${name} of an earlier run is still to be removed and the Docker engine does not answer (${toGatewayError(error).message.split('\n')[0]}); nothing new is started there until it is`, {
        retryable: true,
        suggestions: ['check `timeout 10 docker info`; start or restart the engine: sudo systemctl restart docker'],
      })
    }
  }
}

/** Owed removals now, when the engine was just found answering (the gateway's engine probe). */
export async function removeOwedContainersNow(): Promise<void> {
  await removeOwedContainers(dockerCli()).catch(() => {})
}

/**
 * For a process about to exit (gateway shutdown): stops retrying owed removals and aborts the
 * docker calls in flight, whose clients would otherwise hold the exit while the engine hangs.
 * Returns the containers left for the next start-up (it removes containers whose owner is gone).
 */
export function abandonEngineWork(): string[] {
  clearTimeout(removalRetry)
  removalRetry = undefined
  giveUp.abort()
  giveUp = new AbortController()
  return [...owedRemovals.keys()]
}

/**
 * Resolves with the image once it is ready. Past the run's deadline the engine is asked whether
 * it still answers: a hung one fails the run now; an answering one (a first build) is waited for.
 */
async function readyBeforeDeadline<T>(cli: DockerCli, deadline: number, signal: AbortSignal | undefined, work: (signal: AbortSignal) => Promise<T>): Promise<T> {
  const controller = new AbortController()
  const onAbort = () => controller.abort(signal?.reason)
  signal?.addEventListener('abort', onAbort, {once: true})
  if (signal?.aborted) onAbort()
  const ready = work(controller.signal)
  let timer: NodeJS.Timeout | undefined
  const late = new Promise<'late'>((resolve) => (timer = setTimeout(() => resolve('late'), Math.max(0, deadline - Date.now()))))
  try {
    if ((await Promise.race([ready, late])) !== 'late') return ready
    const answers = await cli.exec(['version', '--format', '{{.Server.Version}}'], {timeoutMs: ENGINE_PING_TIMEOUT_MS}).then(
      (result) => result.exitCode === 0,
      () => false,
    )
    if (answers) return await ready
    controller.abort()
    ready.catch(() => {})
    reportEngineProblem(`the Docker engine did not answer within ${ENGINE_PING_TIMEOUT_MS / 1000} s`)
    watchEngine(cli)
    throw new GatewayError('E_DOCKER_HUNG', `the run's deadline passed while its container was being prepared and the Docker engine did not answer; nothing was started`, {
      retryable: true,
      suggestions: ['check `timeout 10 docker info`; restart the engine: sudo systemctl restart docker'],
    })
  } finally {
    clearTimeout(timer)
    signal?.removeEventListener('abort', onAbort)
  }
}

/** Keeps `work` in `pending` until it settles, so shutdown can wait for it. */
function track(pending: Set<Promise<void>>, work: Promise<void>): Promise<void> {
  pending.add(work)
  void work.finally(() => pending.delete(work))
  return work
}

/** Resolves when every container this process started has exited and been removed (for `send`, shutdown and tests). */
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

/** The uid a container runs as when the gateway is root and container_mode.user is unset: never root. */
export const UNPRIVILEGED_CONTAINER_UID = 65532

/** container_mode.user, else the gateway's own uid:gid, else (gateway is root) an unprivileged uid. */
export function containerUser(configured: string | undefined, own = {uid: process.getuid?.() ?? 1000, gid: process.getgid?.() ?? 1000}): {uid: number; gid: number} {
  if (configured) {
    const [uid, gid = uid] = configured.split(':').map(Number)
    return {uid: uid!, gid: gid!}
  }
  if (own.uid !== 0) return own
  return {uid: UNPRIVILEGED_CONTAINER_UID, gid: UNPRIVILEGED_CONTAINER_UID}
}

function canonicalWorkspace(workspace: string): string {
  try {
    return fs.realpathSync(workspace)
  } catch {
    throw new GatewayError('E_WORKSPACE', `the workspace ${workspace} does not exist`, {suggestions: ['run meepagateway agent create, or send a message (it creates the workspace)']})
  }
}

/** The helper's path inside the isolation image, which bundles dist/ (and so the helper, built on Linux). */
function bundledSandboxHelper(): string | undefined {
  return fs.existsSync(helperPath()) ? `${CONTAINER_APP}/${path.relative(APP_ROOT, helperPath())}` : undefined
}
