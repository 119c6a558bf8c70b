import fs from 'node:fs'
import {setTimeout as sleep} from 'node:timers/promises'
import path from 'node:path'
import {dockerCli, type DockerCli} from '../../../sandbox/docker/cli.js'
import {createRefusedNote, DockerCommandError, dockerMissing, engineErrorOf} from '../../../sandbox/docker/errors.js'
import {homeLabel} from '../../../sandbox/docker/home-label.js'
import {CONTAINER_APP, CONTAINER_NODE, LABEL, sha256} from '../../../sandbox/docker/dockerfile.js'
import {
  ensureContainerImage,
  ensureIsolationImage,
  planImages,
  type ImageContext,
} from '../../../sandbox/docker/images.js'
import {CONTAINER_WORKSPACE, containerNameFor, type DockerRunSpec} from '../../../sandbox/docker/run-args.js'
import type {AgentRunOutput} from '../../shapes/agent-run-contract.js'
import {withAgentLock} from '../../workspace/agent-lock.js'
import {handWorkspaceTo} from '../../run-lifecycle/workspace-owner.js'
import type {AgentConfig, GatewayConfig} from '../../config/types.js'
import {DEFAULT_GATEWAY} from '../../config/defaults.js'
import {randomHex} from '../../util/random.js'
import {containerImageContext} from '../../container/context.js'
import {recordEngineImages} from '../../container/engine-state.js'
import {GatewayError, toGatewayError} from '../../util/errors.js'
import {KeyedQueue} from '../../util/keyed-queue.js'
import {signalChild} from '../../util/subprocess.js'
import {failure, failureFromError, outOfMemory, parseAgentRunOutput} from '../../agent-run/output.js'
import {helperPath} from '../../../sandbox/landlock/helper-path.js'
import {APP_ROOT} from '../../util/app-root.js'
import {dockerEngineProblem, markEngineDown, reportEngineAnswered, reportEngineProblem} from './engine-health.js'
import {engineAnswers, ENGINE_PING_TIMEOUT_MS} from './engine-watch.js'
import {startAgentContainer, type AgentContainer, type RunShape} from './agent-container.js'
import {containerHostsFile} from './hosts-file.js'
import {prepareStandby, StandbyNeverStarted, takeStandby} from './standby-pool.js'
import {agentDiskFor, agentDiskForStandby, podmanVolumeHere} from './agent-disk.js'
import {watchVolumeOnEngine} from './volume-watch.js'
import {EngineVolumeLost, endedOnLostVolume, forgetEngineDiskDevice} from '../../container/engine-disk.js'
import {setStandbyBudget, standbyIdleMs} from '../standby-budget.js'
import {splitSyncTrailer} from './sync-trailer.js'
import {SYNC_TAKEN, syncGoLine} from '../../agent-run/workspace-changes.js'
import {enginesOf, LOCAL_ENGINE, nextPlacement, placeRun, watchEngines, type DockerEngine} from './engines.js'
import {
  ChangesOverLimit,
  forgetVolume,
  pullWorkspace,
  pushWorkspace,
  syncedVolume,
  syncingCommand,
  type SyncedVolume,
} from './workspace-sync.js'
import {describeGaps, limitGaps, limitsRefused, podmanHostForRun} from '../../container/podman-limits.js'
import {
  engineApiFor,
  removeOwedContainers,
  removeWhenEngineAnswers,
  scheduleRemoval,
  trackRemoval,
  watchEngineOwingRemovals,
} from './removals.js'
import {forgetRunProcess, recordRunProcess} from '../../run-lifecycle/run-processes.js'
import {sizeBytes} from '../../config/size.js'
import {diskFull, diskUsage, overLimit, watchDiskUsage, type DiskUsage} from '../../run-lifecycle/disk-limit.js'
import {cappedLog} from '../../run-lifecycle/agent-run-process.js'
import type {RunRequest, Runner} from '../types.js'
import {AgentRunChannel} from '../../llm-channel/host.js'
import {DeadlineWatch} from '../../run-lifecycle/deadline-watch.js'
import {setKeeperDeadline} from '../../../sandbox/keeper.js'
import type {Duplex, Readable} from 'node:stream'

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

/** The docker client gets this long past the run's deadline to notice its container died. */
const CLIENT_GRACE_MS = 30_000
/**
 * How long `docker kill` (and then the client's exit) may take before the engine counts as hung
 * and the docker client is killed instead: a run must end within its timeout + 5 s whatever the engine does.
 */
const KILL_TIMEOUT_MS = 2_000
/** After a kill the engine answered, how long the docker client may take to notice its container died. */
const CLIENT_EXIT_AFTER_KILL_MS = 3_000

/** What the user and the operator are told when the engine stopped answering during a run. */
export const ENGINE_HUNG_MESSAGE =
  'the Docker engine did not answer; the container may still be running and will be removed when the engine answers'
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
    // the engine the run counts on until its container has exited (its standby's placement leaves it out)
    let placedOn: string | undefined
    const whole = runQueue.run(
      request.input.agent.id,
      () =>
        withAgentLock(
          request.home,
          request.input.agent.id,
          () => runPlaced(request, options.cli, log, answer, (name) => (placedOn = name)),
          {
            signal: request.signal,
            onWait: (pid) =>
              log(
                `agent ${request.input.agent.id} is busy with another run (process ${pid}); waiting for it to finish`,
              ),
          },
        ),
      {signal: request.signal},
    )
    void trackRemoval(
      whole.then(
        () => {},
        () => {},
      ),
    )
    const output = await Promise.race([answered, whole])
    if (request.standby && request.input.agent.container_mode.standby)
      prepareNextStandby(request, options.cli, log, placedOn)
    return output
  } catch (error) {
    const failed = toGatewayError(error)
    // with an `engines:` list each engine has its own state (engines.ts), set where the run was placed
    if ((failed.code === 'E_DOCKER_DOWN' || failed.code === 'E_DOCKER_HUNG') && !request.config.engines?.length) {
      // /healthz says "engine down" until the engine answers again
      reportEngineProblem(failed.message.split('\n')[0] ?? failed.code)
      watchEngineOwingRemovals(cli)
    }
    return failureFromError(runId, error)
  }
}

/**
 * How long a verified isolation image is trusted without checking again. Checking costs a few
 * docker calls (≈ 20 ms) per message; within this window a rebuilt base is only picked up a little
 * later (the run still uses whatever the tag points to).
 */
const VERIFIED_IMAGE_TTL_MS = 30_000
/**
 * Past the window above and up to this age, a message runs on the image verified last while the
 * check runs behind it (its result is the next message's): chat messages are often minutes apart,
 * and each would otherwise wait for the check. Older than this, the message waits for it.
 */
const VERIFIED_IMAGE_MAX_AGE_MS = 10 * 60_000
const verifiedImages = new Map<string, {image: ReadyImage; at: number; checking?: Promise<unknown>}>()

export interface ReadyImage {
  tag: string
  /** The image the tag points to now: a standby started from an older one is not used. */
  id: string
}

/** The isolation image of the agent: its container image and the runtime, each built when missing or stale. */
export async function readyIsolationImage(
  config: GatewayConfig,
  agent: AgentConfig,
  context: ImageContext,
): Promise<ReadyImage> {
  const key = JSON.stringify([
    config.image_config,
    agent.container_mode.image,
    context.cacheDir,
    (context.cli as Partial<DockerCli>).engineArgs ?? [],
  ])
  const verify = async (checking: ImageContext) => {
    const plan = await planImages(config, agent, checking)
    await ensureContainerImage(plan, checking)
    const {id} = await ensureIsolationImage(plan, checking)
    const image = {tag: plan.isolationTag, id}
    verifiedImages.set(key, {image, at: Date.now()})
    return image
  }
  const verified = verifiedImages.get(key)
  const age = verified ? Date.now() - verified.at : Infinity
  if (verified && age < VERIFIED_IMAGE_TTL_MS) return verified.image
  if (verified && age < VERIFIED_IMAGE_MAX_AGE_MS) {
    // behind the message (its own docker calls go first), and not under its signal: the check
    // outlives it. What it replaces stays until no message can still be about to start from it; a
    // failed check is logged and tried again by the next message.
    verified.checking ??= new Promise((resolve) => setImmediate(resolve))
      .then(() =>
        verify({...context, signal: undefined, onLog: undefined, removeReplacedAfterMs: VERIFIED_IMAGE_MAX_AGE_MS}),
      )
      .catch((error: unknown) => {
        verified.checking = undefined
        process.stderr.write(
          `checking the isolation image of agent ${agent.id} failed (the next message tries again): ${toGatewayError(error).message}\n`,
        )
      })
    return verified.image
  }
  return verify(context)
}

/** Image checks over the engine's API where there is one (see engineApiFor). */
function imageContextFor(
  home: string,
  cli: DockerCli,
  options: {signal: AbortSignal; onLog?: (line: string) => void},
): ImageContext {
  return containerImageContext(home, {cli, ...options, engine: engineApiFor(cli)})
}

/**
 * Places the run on an engine (engines.ts) and runs it there; an engine found down before anything
 * started there is marked down and the run placed again, once. An injected CLI is used as it is.
 */
async function runPlaced(
  request: RunRequest,
  injected: DockerCli | undefined,
  log: (line: string) => void,
  onAnswer: (output: AgentRunOutput) => void,
  /** The engine the run counts on now (undefined once it no longer does). */
  onPlaced: (engine: string | undefined) => void,
): Promise<AgentRunOutput> {
  if (injected) return runOnce(request, injected, log, onAnswer)
  const configured = Boolean(request.config.engines?.length)
  watchEngines(request.config)
  const engines = enginesOf(request.config)
  for (let attempt = 0; ; attempt++) {
    const {engine, release} = placeRun(engines, request.input.agent.container_mode.engines)
    if (configured) log(`running on engine ${engine.name}`)
    onPlaced(engine.name)
    try {
      return await runOnce(request, engine.cli, log, onAnswer, engine)
    } catch (error) {
      // nothing of the message ran: placed again once, on the image attached anew
      if (error instanceof EngineVolumeLost && attempt === 0) {
        log(`${error.message}; attaching it again and placing the run again`)
        continue
      }
      const failed = toGatewayError(error)
      if (!configured || (failed.code !== 'E_DOCKER_DOWN' && failed.code !== 'E_DOCKER_HUNG')) throw error
      markEngineDown(engine.name, failed.message.split('\n')[0] ?? failed.code)
      if (attempt > 0) throw error
      log(`engine ${engine.name} did not answer (${failed.message.split('\n')[0]}); placing the run again`)
    } finally {
      release()
      onPlaced(undefined)
    }
  }
}

async function runOnce(
  request: RunRequest,
  cli: DockerCli,
  log: (line: string) => void,
  onAnswer: (output: AgentRunOutput) => void = () => {},
  engine?: DockerEngine,
): Promise<AgentRunOutput> {
  const {input} = request
  const {agent} = input
  const runId = input.run_id
  const diskLimit = sizeBytes(agent.limits.disk, 'limits.disk')
  const usageBefore = await diskUsage([request.input.workspace], diskLimit)
  if (overLimit(usageBefore, diskLimit))
    return diskFull(runId, agent.limits.disk, usageBefore, request.input.workspace, 'before')
  const dialect = await engineDialect(engine, log, request)
  await removeOwedContainers(cli)
  const deadline = Date.now() + request.timeoutMs
  const image = await readyBeforeDeadline(cli, deadline, request.signal, (signal) =>
    readyIsolationImage(request.config, agent, imageContextFor(request.home, cli, {signal, onLog: log})),
  )
  // what `container clean` may remove on a listed engine: the images this home put there
  if (engine && request.config.engines?.length) recordEngineImages(request.home, engine.name, [image.id])
  const sync = engine && syncedVolumeOn(request, engine)
  const disk = sync && (await agentDiskFor(request, engine!, cli, sync, image.id, log))
  const shape = await runShape(request, image, request.signal, sync?.volume, dialect, disk?.fsid)
  const placed = {engine, image, shape, sync, diskLimit, fsid: disk?.fsid}
  const started = Date.now()
  try {
    return await runOnVolume(request, cli, log, onAnswer, placed).catch((error: unknown) => {
      // no tool of the message ran in it: a fresh container takes the message, within what is
      // left of its timeout; a standby removed after its go line may have marked the volume, so
      // the volume is filled whole
      if (!(error instanceof StandbyNeverStarted)) throw error
      log(`${error.message}; starting a fresh container for this message`)
      if (sync) forgetVolume(sync)
      const timeoutMs = Math.max(1_000, request.timeoutMs - (Date.now() - started))
      return runOnVolume({...request, timeoutMs}, cli, log, onAnswer, {...placed, standby: false})
    })
  } catch (error) {
    // the engine lost the agent's volume (a reboot took its loop device): attached anew before the run is placed again
    if (sync && error instanceof EngineVolumeLost) {
      forgetVolume(sync)
      forgetEngineDiskDevice(request.home, engine!.name, agent.id)
    }
    throw error
  }
}

async function runOnVolume(
  request: RunRequest,
  cli: DockerCli,
  log: (line: string) => void,
  onAnswer: (output: AgentRunOutput) => void,
  placed: {
    engine: DockerEngine | undefined
    image: ReadyImage
    shape: RunShape
    sync: SyncedVolume | undefined
    diskLimit: number
    fsid: string | undefined
    /** false: a fresh container, even when a standby waits (the one taken could not start). */
    standby?: false
  },
): Promise<AgentRunOutput> {
  const {engine, image, shape, sync, diskLimit} = placed
  const {agent} = request.input
  const runId = request.input.run_id
  // a standby's volume too is brought to the host's state now, as the message came (its go line)
  let pushed = false
  if (sync) {
    const {sent, wrote} = await pushWorkspace(cli, sync, {
      workspace: canonicalWorkspace(request.input.workspace),
      image: image.id,
      uid: shape.spec.uid,
      gid: shape.spec.gid,
      labels: shape.spec.labels,
      fsid: placed.fsid,
      signal: request.signal,
      log,
    }).catch((error: unknown) => {
      if (error instanceof DockerCommandError && endedOnLostVolume(error.result.exitCode, error.result.stderr))
        throw new EngineVolumeLost(engine!.name, error.message)
      throw error
    })
    pushed = wrote
    if (sent > 0) log(`workspace sync: sent ${sent} changed file(s) and folder(s) to engine ${engine!.name}`)
  }
  const standby =
    placed.standby === false ? undefined : takeStandby(standbySlot(request), shape.key, engine?.name ?? LOCAL_ENGINE)
  if (standby) log(`running in standby container ${standby.name}, started before this message arrived`)
  const container =
    standby ??
    (await startAgentContainer(cli, shape, {
      name: containerNameFor(runId),
      run: runId,
      clientTimeoutMs: request.timeoutMs + CLIENT_GRACE_MS,
      // a hung engine fails the message within its timeout, as a hung `docker run` did
      createTimeoutMs: request.timeoutMs,
      signal: request.signal,
      log,
    }))
  container.log = cappedLog(log)
  const {name, child} = container
  // the keeper removes the container if this process dies; the record covers the keeper dying too
  // on a listed engine, where: the next start-up removes it there (and forgets what the volume holds)
  const onEngine = engine && request.config.engines?.length ? {name: engine.name, args: cli.engineArgs} : undefined
  recordRunProcess(
    request.home,
    {
      runId,
      keeperPid: child.pid,
      cgroups: [],
      container: name,
      ...(onEngine ? {engine: {...onEngine, ...(sync ? {syncState: sync.file} : {})}} : {}),
    },
    log,
  )
  request.onStarted?.()
  // limits.disk: the workspace is a bind mount, measured from here (see disk-limit.ts); on a Podman
  // engine of this machine, its volume here; on another sync engine without a disk image, on the
  // engine itself (volume-watch.ts); a disk image holds it by itself
  const here = sync && engine && (await podmanVolumeHere(cli, engine, sync.volume))
  let overWhileRunning: DiskUsage | undefined
  const onOver = (usage: DiskUsage) => {
    overWhileRunning = usage
    void cli.exec(['kill', name], {timeoutMs: KILL_TIMEOUT_MS}).catch(() => {})
  }
  const diskWatch =
    sync && !placed.fsid && !here
      ? watchVolumeOnEngine(
          cli,
          {volume: sync.volume, image: image.id, labels: shape.spec.labels, limitBytes: diskLimit},
          onOver,
        )
      : watchDiskUsage([here || request.input.workspace], diskLimit, onOver)
  // on a sync engine the run's changes come after its last frame (sync-trailer.ts), taken back
  // as they arrive; the reply waits until they are on the host
  const split = sync && splitSyncTrailer(child.stdout!, diskLimit, sync.spoolDir)
  let takenBack: Promise<AgentRunOutput> | undefined
  /** The take-back's fsyncs, after the reply (pullWorkspace): the run ends once they are done. */
  let settled: Promise<void> | undefined
  try {
    let pulled = false
    const takeBack =
      split &&
      ((answered: AgentRunOutput) =>
        (takenBack ??= (async () => {
          try {
            const taken = await pullWorkspace(cli, sync, {
              runId,
              pushed,
              helper: {
                image: image.id,
                uid: shape.spec.uid,
                gid: shape.spec.gid,
                labels: shape.spec.labels,
                fsid: placed.fsid,
              },
              workspace: request.input.workspace,
              maxBytes: diskLimit,
              log,
              trailer: await split.trailer,
              spoolFailure: split.spoolFailure(),
              since: container.syncSince,
            })
            pulled = true
            settled = taken.settled
            if (taken.received > 0)
              log(`workspace sync: took back ${taken.received} changed file(s) from engine ${engine!.name}`)
            return answered
          } catch (error) {
            // written past limits.disk, ended before the watch read it: the same answer the watch gives
            if (error instanceof ChangesOverLimit)
              return diskFull(runId, agent.limits.disk, {bytes: error.bytes}, request.input.workspace, 'during')
            const failed = toGatewayError(error)
            return failure(
              runId,
              'E_WORKSPACE',
              `the run ended on engine ${engine!.name}, but its changes to the workspace could not be brought back: ${failed.message}`,
              true,
              {partly_ran: true, ...(failed.suggestions.length > 0 ? {suggestions: failed.suggestions} : {})},
            )
          } finally {
            // agent-run, waiting since its trailer, ends now: the container's teardown on the
            // engine no longer runs while the changes are written here (after the reply's turn)
            setImmediate(() => {
              if (child.stdin && !child.stdin.writableEnded) child.stdin.end(`${SYNC_TAKEN}\n`)
            })
          }
        })()))
    const output = await runInStartedContainer(
      request,
      cli,
      container,
      shape.spec.forwardEnv,
      takeBack ? (answered) => void takeBack(answered).then(onAnswer) : onAnswer,
      Boolean(standby),
      takeBack,
      split ? split.frames : child.stdout!,
      // in the input's own write: the run waits for both, and each write wakes the docker client
      sync ? syncGoLine(runId, pushed, diskLimit, sync.fill!, namesKept(standby, sync, pushed)) : '',
    )
    await takenBack
    // what a run that did not finish did to the volume is unknown: the next run there starts from the host's copy
    if (sync && !pulled) forgetVolume(sync)
    // the agent's next run waits for these (the run holds its lock until it returns)
    await settled?.catch((error: unknown) => {
      log(
        `workspace sync: the changes taken back from engine ${engine!.name} are in the workspace, but could not be made durable (${toGatewayError(error).message}); the next run there copies the workspace whole`,
      )
      forgetVolume(sync!)
    })
    const atEnd = await diskWatch.stop()
    if (atEnd.over || overWhileRunning)
      return diskFull(
        runId,
        agent.limits.disk,
        atEnd.over ? atEnd.usage : overWhileRunning!,
        request.input.workspace,
        'during',
      )
    return output
  } finally {
    // a run that failed after its take-back still holds the agent's lock until its record is written
    await settled?.catch(() => {})
    void diskWatch.stop()
    forgetRunProcess(request.home, runId)
    // a trailer no take-back claimed (the run failed after sending it) is freed when it is whole
    if (split && !takenBack) void split.trailer.then((trailer) => trailer?.close())
  }
}

/**
 * Whether a standby's names, taken while it waited, are the run's start: nothing was pushed for
 * this message, and the volume's generation is the one it started at (no run or push since).
 */
export function namesKept(standby: AgentContainer | undefined, sync: SyncedVolume, pushed: boolean): boolean {
  return Boolean(!pushed && standby?.syncGeneration && standby.syncGeneration === sync.generation)
}

async function runInStartedContainer(
  request: RunRequest,
  cli: DockerCli,
  container: AgentContainer,
  forwardEnv: string[],
  onAnswer: (output: AgentRunOutput) => void,
  /** A standby: its container was already running when the message came. */
  fromStandby = false,
  /** After agent-run ended well, before its container is removed (a sync engine takes back the changes). */
  beforeRemoval: ((output: AgentRunOutput) => Promise<AgentRunOutput>) | undefined = undefined,
  /** agent-run's frames: its container's stdout, or what comes of it before a sync engine's trailer. */
  frames: Readable = container.child.stdout!,
  /** Before the input, in its write (a sync engine's go line). */
  goLine = '',
): Promise<AgentRunOutput> {
  const {input} = request
  const {agent} = input
  const runId = input.run_id
  const log = container.log
  const {name, child} = container
  // The input goes in on stdin, then the LLM channel runs over the same pipe; forwarded secrets
  // reach the engine through the docker CLI's own environment (`-e NAME` without a value), never argv.
  let channelBroken = false
  const channel = new AgentRunChannel(
    child.stdin!,
    frames,
    {
      ...input,
      workspace: CONTAINER_WORKSPACE,
      env_secrets: forwardEnv,
      timeout_ms: request.timeoutMs + CONTAINER_SELF_DEADLINE_MARGIN_MS,
    },
    request.llm,
    () => {
      channelBroken = true
      stop('violation')
    },
    () => {
      if (!stopped) onAnswer(channel.outcome()!)
    },
    undefined,
    // a sync engine's run sends its changes after the result and, in a running gateway (whose
    // reply does not wait for the container's end), ends once they are taken (runOnVolume)
    beforeRemoval !== undefined && Boolean(request.standby),
    goLine,
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
      const exited = await Promise.race([
        child.then(() => true),
        sleep(answered ? CLIENT_EXIT_AFTER_KILL_MS : 0, false, {ref: false}),
      ])
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
  // agent-run never started: the volume mounted was not the agent's, or could not be mounted
  if (!channel.spoke && !stopped && endedOnLostVolume(result.exitCode, stderrTail)) {
    scheduleRemoval(cli, name, log)
    throw new EngineVolumeLost(undefined, stderrTail.trim().split('\n').pop() ?? 'its container ended before starting')
  }
  const answer = channel.outcome()
  if (answer && beforeRemoval && !engineSilent && (stopped === 'timeout' || stopped === 'cancelled')) {
    // a sync engine's run answered, then was stopped while the host took its changes back (its
    // container now waits for that): the answer and those changes stand
    scheduleRemoval(cli, name, log)
    return await beforeRemoval(answer)
  }
  if (stopped === 'timeout' && deadline.suspendedMs !== undefined && answer) {
    // it answered while this process was stopped, the deadline passing meanwhile: the answer stands
    scheduleRemoval(cli, name, log)
    return answer
  }
  if (result.code === 'ENOENT') throw dockerMissing(cli.bin, cli.binFromEnv)
  if (result.exitCode === 0 && !stopped) {
    // agent-run answered, and itself reported any command the kernel killed for memory: the
    // container only needs removing, which the reply does not wait for.
    const answered = channel.outcome() ?? parseAgentRunOutput(runId, '', 0, stderrTail)
    const output = beforeRemoval ? await beforeRemoval(answered) : answered
    scheduleRemoval(cli, name, log)
    reportEngineAnswered()
    return output
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
    return failure(runId, 'E_DOCKER_HUNG', `${why}${ENGINE_HUNG_MESSAGE}; ${PARTLY_RAN}`, true, {
      stderr_tail: stderrTail,
      partly_ran: true,
    })
  }
  // what is left of the run's timeout + 5 s, at least 3 s: a busy engine is not a hung one
  const state = await collectContainer(
    cli,
    name,
    log,
    Math.max(3_000, containerStarted + request.timeoutMs + 5_000 - Date.now()),
  )
  if (state === 'engine-lost') {
    // docker run could not reach the engine at all: nothing was started (agent-run never spoke, and no standby was waiting)
    const engineError = fromStandby || channel.spoke ? undefined : engineErrorOf(stderrTail)
    if (engineError) throw engineError
    // the container existed (it was started) but the engine went away before saying how it ended
    return failure(
      runId,
      'E_DOCKER_DOWN',
      `the Docker engine stopped answering during the run (docker run exit ${result.exitCode ?? 'unknown'}); ${PARTLY_RAN}; the container may still be running and will be removed when the engine answers, before anything else starts there`,
      true,
      {stderr_tail: stderrTail, partly_ran: true},
    )
  }
  if (state?.oomKilled)
    return outOfMemory(runId, agent.container_mode.memory_limit, {stderr_tail: stderrTail, exit_code: state.exitCode})
  if (stopped === 'timeout') {
    return deadline.failure(
      runId,
      (seconds) =>
        `the run took longer than ${seconds} s (container_mode.timeout_seconds) and its container was killed`,
      {stderr_tail: stderrTail},
    )
  }
  if (stopped === 'cancelled')
    return failure(runId, 'E_RUN', 'the run was cancelled and its container was killed', true)
  const exitCode = result.exitCode
  if (!state) {
    // The container never existed: docker itself refused (engine down, bad image, name clash).
    const engineError = engineErrorOf(stderrTail)
    if (engineError) throw engineError
    const why = `docker run failed before the container started (exit ${exitCode ?? 'unknown'}): ${stderrTail.trim().split('\n').slice(-3).join(' | ')}`
    // a standby made before the message (its volume since removed, say), or removed while it
    // waited: agent-run never spoke, so no tool of the message ran
    if (fromStandby && !channel.spoke) throw new StandbyNeverStarted(name, why)
    throw new GatewayError('E_DOCKER', `${why}${createRefusedNote(stderrTail)}`, {
      details: {stderr_tail: stderrTail},
    })
  }
  return channel.outcome() ?? parseAgentRunOutput(runId, '', state.exitCode, stderrTail)
}

/**
 * What the run's argv must say for its engine: Podman's dialect, and on a Podman engine that cannot
 * apply a limit, the refusal naming it, or with the engine's best_effort: true the run without it, said in the run's log.
 */
async function engineDialect(
  engine: DockerEngine | undefined,
  log: (line: string) => void,
  request: Pick<RunRequest, 'timeoutMs' | 'signal'>,
): Promise<Pick<DockerRunSpec, 'engineKind' | 'unappliedLimits'>> {
  if (engine?.config?.kind !== 'podman') return {}
  const gaps = limitGaps(await podmanHostForRun(engine.config, request.timeoutMs, request.signal))
  if (gaps.length === 0) return {engineKind: 'podman'}
  if (!engine.config.best_effort) throw limitsRefused(engine.name, gaps)
  log(
    `best effort: engine ${engine.name} runs this message WITHOUT ${gaps.map((gap) => gap.limit).join(', ')} (best_effort: true): ${describeGaps(gaps)}`,
  )
  return {engineKind: 'podman', unappliedLimits: gaps.map((gap) => gap.limit)}
}

/**
 * After a run in a running gateway: the agent's next container, started now on the engine its next
 * run would be placed on (an injected CLI: that one), waits there for the message.
 */
function prepareNextStandby(
  request: RunRequest,
  injected: DockerCli | undefined,
  log: (line: string) => void,
  /** Where the run that just answered is ending. */
  placedOn: string | undefined,
): void {
  const configured = !injected && Boolean(request.config.engines?.length)
  // a hung local engine would only leave one more docker client hanging; a listed one down is not placed on
  if (!configured && dockerEngineProblem()) return
  const engine = injected
    ? undefined
    : nextPlacement(enginesOf(request.config), request.input.agent.container_mode.engines, placedOn)
  if (!injected && !engine) return
  const cli = injected ?? engine!.cli
  // on a sync engine with a disk image, only once it is attached (a standby would make a plain volume)
  const disk = engine ? agentDiskForStandby(request, engine) : undefined
  if (disk === false) return
  setStandbyBudget(request.config.gateway)
  prepareStandby(
    standbySlot(request),
    cli,
    engine?.name ?? LOCAL_ENGINE,
    async (signal) => {
      const image = await readyIsolationImage(
        request.config,
        request.input.agent,
        imageContextFor(request.home, cli, {signal}),
      )
      const dialect = await engineDialect(engine, log, {timeoutMs: request.timeoutMs, signal})
      const shape = await runShape(
        request,
        image,
        signal,
        engine && syncedVolumeOn(request, engine)?.volume,
        dialect,
        disk ? disk.fsid : undefined,
      )
      const name = containerNameFor(`standby_${randomHex(8)}`)
      return async (startSignal: AbortSignal) => {
        // read before it starts: a run or push after this one changes it, and its names are stale
        const generation = engine && syncedVolumeOn(request, engine)?.generation
        const container = await startAgentContainer(cli, shape, {
          name,
          run: 'standby',
          clientTimeoutMs: standbyIdleMs() + request.timeoutMs + CLIENT_GRACE_MS,
          createTimeoutMs: request.timeoutMs,
          signal: startSignal,
          log,
        })
        if (generation) container.syncGeneration = generation
        return container
      }
    },
    log,
  )
}

/** The agent's volume on a sync engine (workspace-sync.ts); undefined on one that binds the host path. */
function syncedVolumeOn(request: RunRequest, engine: DockerEngine): SyncedVolume | undefined {
  if (engine.workspace !== 'sync') return undefined
  return syncedVolume(request.home, engine.name, homeLabel(request.home), request.input.agent.id)
}

function standbySlot(request: RunRequest): string {
  return `${homeLabel(request.home)}/${request.input.agent.id}`
}

async function runShape(
  request: RunRequest,
  image: ReadyImage,
  signal: AbortSignal | undefined,
  /** The engine-side volume that stands for the workspace on a sync engine. */
  volume?: string,
  dialect: Pick<DockerRunSpec, 'engineKind' | 'unappliedLimits'> = {},
  /** The volume's filesystem id, when it is the agent's disk image on that engine (engine-disk.ts). */
  fsid?: string,
): Promise<RunShape> {
  const {input} = request
  const {agent} = input
  const forwardEnv = injectedSecretNames(request.config, input.secrets)
  const cliEnv = Object.fromEntries(forwardEnv.map((secretName) => [secretName, input.secrets[secretName] ?? '']))
  const workspace = volume ?? canonicalWorkspace(request.input.workspace)
  const user = containerUser(agent.container_mode.user)
  // every run and standby: a walk only when a run as another user had the workspace since (owner.ts)
  if (!volume) await handWorkspaceTo(workspace, user, {purpose: 'the container', signal})
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
    // a container of this machine's engine, made with no network of the engine's (agent-container.ts)
    ...(volume || dialect.engineKind === 'podman' || agent.container_mode.network !== 'none'
      ? {}
      : {hostsFile: containerHostsFile(request.home)}),
    ...dialect,
    // on a sync engine the same agent-run, followed by the list of what it changed
    ...(volume ? syncingCommand([CONTAINER_NODE, `${CONTAINER_APP}/bin/run.js`, 'agent-run'], fsid) : {}),
  }
  return {spec, cliEnv, key: sha256(JSON.stringify([spec, image.id, cliEnv, request.timeoutMs]))}
}

/**
 * How a container that did not answer ended (OOMKilled, exit code), then removed: undefined when
 * it was never created. Waits for the removal: "nothing left behind" matters most after a kill.
 */
async function collectContainer(
  cli: DockerCli,
  name: string,
  log: (line: string) => void,
  timeoutMs: number,
): Promise<{oomKilled: boolean; exitCode: number} | 'engine-lost' | undefined> {
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

/**
 * Resolves with the image once it is ready. Past the run's deadline the engine is asked whether
 * it still answers: a hung one fails the run now; an answering one (a first build) is waited for.
 */
async function readyBeforeDeadline<T>(
  cli: DockerCli,
  deadline: number,
  signal: AbortSignal | undefined,
  work: (signal: AbortSignal) => Promise<T>,
): Promise<T> {
  const controller = new AbortController()
  const onAbort = () => controller.abort(signal?.reason)
  signal?.addEventListener('abort', onAbort, {once: true})
  if (signal?.aborted) onAbort()
  const ready = work(controller.signal)
  let timer: NodeJS.Timeout | undefined
  const late = new Promise<'late'>(
    (resolve) => (timer = setTimeout(() => resolve('late'), Math.max(0, deadline - Date.now()))),
  )
  try {
    if ((await Promise.race([ready, late])) !== 'late') return ready
    if (await engineAnswers(cli)) return await ready
    controller.abort()
    ready.catch(() => {})
    reportEngineProblem(`the Docker engine did not answer within ${ENGINE_PING_TIMEOUT_MS / 1000} s`)
    watchEngineOwingRemovals(cli)
    throw new GatewayError(
      'E_DOCKER_HUNG',
      `the run's deadline passed while its container was being prepared and the Docker engine did not answer; nothing was started`,
      {
        retryable: true,
        suggestions: ['check `timeout 10 docker info`; restart the engine: sudo systemctl restart docker'],
      },
    )
  } finally {
    clearTimeout(timer)
    signal?.removeEventListener('abort', onAbort)
  }
}

/**
 * Secrets that are also set in the container's environment: provider keys when
 * image_config.inject_credentials_env, the agent's other secrets when inject_secrets_env.
 * Names the docker CLI itself reads (DOCKER_*, PATH, HOME, ...) are never forwarded: the value
 * would change what the CLI does, not just what the container sees.
 */
export function injectedSecretNames(config: GatewayConfig, secrets: Record<string, string>): string[] {
  const credentials = new Set(
    Object.values(config.providers.providers).flatMap((provider) =>
      provider.api_key_env ? [provider.api_key_env] : [],
    ),
  )
  return Object.keys(secrets)
    .filter((name) =>
      credentials.has(name) ? config.image_config.inject_credentials_env : config.image_config.inject_secrets_env,
    )
    .filter(
      (name) =>
        !/^(DOCKER_|XDG_)/.test(name) &&
        !['PATH', 'HOME', 'USER', 'TMPDIR', 'SSH_AUTH_SOCK'].includes(name) &&
        !/_PROXY$/i.test(name),
    )
    .sort()
}

/** The uid a container runs as when the gateway is root and container_mode.user is unset: never root. */
export const UNPRIVILEGED_CONTAINER_UID = 65532

/** container_mode.user, else the gateway's own uid:gid, else (gateway is root) an unprivileged uid. */
export function containerUser(
  configured: string | undefined,
  own = {uid: process.getuid?.() ?? 1000, gid: process.getgid?.() ?? 1000},
): {uid: number; gid: number} {
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
    throw new GatewayError('E_WORKSPACE', `the workspace ${workspace} does not exist`, {
      suggestions: ['run meepagateway agent create, or send a message (it creates the workspace)'],
    })
  }
}

/** The helper's path inside the isolation image, which bundles dist/ (and so the helper, built on Linux). */
function bundledSandboxHelper(): string | undefined {
  return fs.existsSync(helperPath()) ? `${CONTAINER_APP}/${path.relative(APP_ROOT, helperPath())}` : undefined
}
