import {createHash} from 'node:crypto'
import fs from 'node:fs'
import type {AgentRunOutput} from '../shapes/agent-run-contract.js'
import {
  runAgentProcess,
  startAgentProcess,
  type AgentProcessLaunch,
  type StartedAgentProcess,
} from '../run-lifecycle/agent-run-process.js'
import {makePrivateTmp, removePrivateTmp, withPrivateTmp} from '../run-lifecycle/private-tmp.js'
import type {RunRequest, StandbyOptions} from './types.js'
import {
  admitStandby,
  releaseStandby,
  setStandbyBudget,
  standbysAllowed,
  type BudgetedStandby,
} from './standby-budget.js'
import type {IsolationLevel} from '../config/types.js'
import {buildIdentity} from '../util/build-identity.js'
import {isEmptyDirectory} from '../util/empty-directory.js'
import {randomHex} from '../util/random.js'

/**
 * agent-run processes a running gateway starts ahead of an agent's next message (unrestricted and
 * host-sandbox agents): Node's start, agent-run's bundle and, in the host sandbox, bubblewrap's
 * namespaces and the helper's rules are then behind it, not in front of the reply. Each is under
 * its keeper and in its cgroups from the start, so a crashed gateway leaves none behind, and each
 * serves one message: nothing ran in it before its input.
 */

// How many wait at once and for how long: the operator's budget for every level (standby-budget.ts).
/** How often a message looks at a standby still starting, until its agent-run is in its cgroups. */
const STARTING_POLL_MS = 5
/** A standby whose agent-run is still not there this long after a message came is not waited for. */
const STARTING_WAIT_MS = 3_000

/**
 * What a standby is started with, and what shapes it: two plans with the same shape start the same
 * run, whatever private TMPDIR each was given.
 */
export interface StandbyPlan {
  launch: AgentProcessLaunch
  /** Each part by the name the log gives it (the agent's config, the launch: policy, environment). */
  shape: Record<string, unknown>
  /** The run's TMPDIR is a tmpfs of its own mount namespace (bubblewrap), over an empty host directory. */
  privateTmpfs?: boolean
}

/** Digest of each part of a plan's shape, the TMPDIR's path left out; the app's build is always one. */
export type StandbyShape = Record<string, string>

export function standbyShape(plan: Pick<StandbyPlan, 'shape'>, tmpDir: string): StandbyShape {
  const names = [...new Set([tmpDir, realPath(tmpDir)])]
  const digest = (value: unknown) => {
    let text = JSON.stringify(value) ?? 'undefined'
    for (const name of names) text = text.replaceAll(name, '\0TMPDIR\0')
    return createHash('sha256').update(text).digest('hex')
  }
  return Object.fromEntries(
    Object.entries({'the app build': buildIdentity(), ...plan.shape}).map(([name, part]) => [name, digest(part)]),
  )
}

interface Standby {
  shape: StandbyShape
  process: StartedAgentProcess
  tmpDir: string
  /** The host directory it was given (device, inode): one put in its place is not its. */
  tmpIdentity: string
  privateTmpfs: boolean
  /** How it counts against the standby budget. */
  budgeted: BudgetedStandby
}

/** One per slot (a gateway home's agent), in the order they were prepared. */
const standbys = new Map<string, Standby>()
/** Slots whose standby is being planned (the host sandbox's policy is worked out first). */
const preparing = new Map<string, Promise<void>>()
/** Bumped when a home's standbys are ended: a plan made before then starts nothing. */
const generations = new Map<string, number>()
const homeOf = (slot: string) => slot.slice(0, slot.indexOf('\0'))

/** The private TMPDIR of the slot's waiting standby: a run plans its launch with it, to compare shapes. */
export function waitingStandbyTmp(slot: string): string | undefined {
  return standbys.get(slot)?.tmpDir
}

/**
 * The slot's standby when it was started with the same shape and is whole: its agent-run in its
 * cgroups (one still starting is waited for), its keeper alive, its TMPDIR as it was made;
 * undefined otherwise, and `log` says why it is not used (it is ended: the run starts cold).
 */
export async function takeStandbyAgentRun(
  slot: string,
  shape: StandbyShape,
  log?: (line: string) => void,
): Promise<{process: StartedAgentProcess; tmpDir: string} | undefined> {
  const standby = unlist(slot)
  if (!standby) return undefined
  const fault = shapeChange(standby.shape, shape) ?? (await startFault(standby)) ?? tmpFault(standby)
  if (!fault) return standby
  log?.(`not using the standby agent-run prepared for this agent: ${fault}; starting the run cold`)
  void dispose(standby)
  return undefined
}

/**
 * The run cannot be planned with the standby's TMPDIR (it is gone, or the sandbox now refuses the
 * agent's runs): the standby is ended and the run is planned cold, which says what is wrong.
 */
function dropStandby(slot: string, failed: AgentRunOutput, log?: (line: string) => void): undefined {
  const standby = unlist(slot)
  if (!standby) return undefined
  const why = failed.ok ? 'no launch' : failed.error.message
  log?.(
    `not using the standby agent-run prepared for this agent: its run cannot be planned with it (${why}); starting the run cold`,
  )
  void dispose(standby)
  return undefined
}

/** Waits for a starting standby's agent-run to be in its cgroups; what went wrong meanwhile, if anything. */
async function startFault(standby: Standby): Promise<string | undefined> {
  const giveUp = Date.now() + STARTING_WAIT_MS
  for (;;) {
    const fault = standby.process.idleFault(false)
    if (fault) return fault
    if (!standby.process.hasCgroups || standby.process.agentRunPid() !== undefined)
      return standby.process.idleFault(true)
    if (Date.now() > giveUp) return `its agent-run had not started ${STARTING_WAIT_MS} ms after the message came`
    await new Promise((resolve) => setTimeout(resolve, STARTING_POLL_MS))
  }
}

function shapeChange(was: StandbyShape, now: StandbyShape): string | undefined {
  const changed = [...new Set([...Object.keys(was), ...Object.keys(now)])].filter((name) => was[name] !== now[name])
  return changed.length > 0 ? `${changed.join(', ')} changed since it was started` : undefined
}

/**
 * Its TMPDIR is still the empty directory it was given, and (bubblewrap) the run's view of it is an
 * empty tmpfs of its own: nothing was put where the next message's run will look.
 */
function tmpFault(standby: Standby): string | undefined {
  const {tmpDir} = standby
  let host: fs.Stats
  try {
    host = fs.lstatSync(tmpDir)
  } catch {
    return `its TMPDIR ${tmpDir} is gone`
  }
  if (!host.isDirectory() || identity(host) !== standby.tmpIdentity) return `its TMPDIR ${tmpDir} was replaced`
  if (!isEmptyDirectory(tmpDir)) return `its TMPDIR ${tmpDir} is not empty`
  const pid = standby.process.agentRunPid()
  if (!standby.privateTmpfs || pid === undefined) return undefined
  const inside = `/proc/${pid}/root${tmpDir}`
  try {
    if (fs.statSync(inside).dev === host.dev) return `its TMPDIR ${tmpDir} is no longer a tmpfs of its own`
  } catch (error) {
    return `its TMPDIR ${tmpDir} cannot be checked inside its namespace: ${(error as Error).message}`
  }
  if (!isEmptyDirectory(inside)) return `something was written in its TMPDIR ${tmpDir} before its message`
  return undefined
}

const identity = (stat: fs.Stats) => `${stat.dev}:${stat.ino}`

function realPath(file: string): string {
  try {
    return fs.realpathSync(file)
  } catch {
    return file
  }
}

/**
 * Starts the slot's next agent-run unless one of the same shape waits there. `plan` gets its private
 * TMPDIR and the id its keeper, cgroups and record go by (the run's own id comes with its input);
 * undefined: none can be started (it said why). Nothing starts once `wanted()` is false.
 */
export function prepareStandbyAgentRun(
  slot: string,
  plan: (tmpDir: string, processId: string) => Promise<StandbyPlan | undefined> | StandbyPlan | undefined,
  options: {level: IsolationLevel; wanted: () => boolean; log: (line: string) => void},
): void {
  if (preparing.has(slot) || !options.wanted() || !standbysAllowed()) return
  const generation = generations.get(homeOf(slot)) ?? 0
  const processId = `run_${randomHex(8)}`
  const {log} = options
  const done = (async () => {
    let tmpDir: string | undefined
    // it runs after a reply, on its own: a full or missing TMPDIR is logged, never the gateway's end
    try {
      tmpDir = makePrivateTmp(processId)
      const planned = await plan(tmpDir, processId)
      const waiting = standbys.get(slot)
      const shape = planned && standbyShape(planned, tmpDir)
      const current = options.wanted() && (generations.get(homeOf(slot)) ?? 0) === generation
      if (!planned || !shape || !current || (waiting && !shapeChange(waiting.shape, shape))) {
        await removePrivateTmp(tmpDir, log)
        return
      }
      if (waiting) void dispose(unlist(slot)!)
      const tmpIdentity = identity(fs.lstatSync(tmpDir))
      const process = startAgentProcess({...planned.launch, onStderr: log})
      const standby: Standby = {
        shape,
        process,
        tmpDir,
        tmpIdentity,
        privateTmpfs: Boolean(planned.privateTmpfs),
        budgeted: {
          level: options.level,
          evict: () => {
            if (standbys.get(slot) === standby) void dispose(unlist(slot)!)
          },
          residentBytes: () => process.residentBytes(),
        },
      }
      standbys.set(slot, standby)
      // the budget may end the least recently used agent's standby, or (none allowed) this one
      if (!admitStandby(standby.budgeted)) void dispose(unlist(slot)!)
    } catch (error) {
      log(`could not start a standby agent-run: ${(error as Error).message}`)
      if (tmpDir) await removePrivateTmp(tmpDir, log)
    }
  })()
  preparing.set(slot, done)
  void done.finally(() => preparing.delete(slot))
}

/** Takes the slot's standby off the list (and its timers off): the caller uses or ends it. */
function unlist(slot: string): Standby | undefined {
  const standby = standbys.get(slot)
  if (!standby) return undefined
  standbys.delete(slot)
  releaseStandby(standby.budgeted)
  return standby
}

async function dispose(standby: {process: StartedAgentProcess; tmpDir: string}): Promise<void> {
  await standby.process.discard()
  // a start-up reclaims what is left (its name carries this process's pid)
  await removePrivateTmp(standby.tmpDir)
}

/** Ends the standby agent-runs of this process: those of one gateway home (it stops, or its config changed), or all. */
export async function stopStandbyAgentRuns(home?: string): Promise<void> {
  const inHome = (slot: string) => home === undefined || homeOf(slot) === home
  for (const name of new Set([...[...standbys.keys(), ...preparing.keys()].map(homeOf), ...(home ? [home] : [])]))
    if (home === undefined || name === home) generations.set(name, (generations.get(name) ?? 0) + 1)
  // plans under way start nothing now; wait for them so that none is left starting
  await Promise.all([...preparing].filter(([slot]) => inHome(slot)).map(([, done]) => done))
  const ending = [...standbys.keys()].filter(inHome).map((slot) => unlist(slot)!)
  await Promise.all(ending.map(dispose))
}

/** How a runner plans one agent-run: for a message (`log`, `signal` its own) or for a standby. */
export type PlanAgentRun = (
  tmpDir: string,
  processId: string,
  context: {log?: (line: string) => void; signal?: AbortSignal},
) => Promise<StandbyPlan | AgentRunOutput>

/**
 * Runs the request's message in the agent's standby when one of the same shape waits whole, else
 * cold in a new private TMPDIR, exactly as without standbys. In a running gateway (request.standby)
 * the agent's next agent-run is planned and started once the run ends.
 */
export async function runInStandbyOrCold(
  request: RunRequest,
  level: IsolationLevel,
  plan: PlanAgentRun,
): Promise<AgentRunOutput> {
  const runId = request.input.run_id
  const slot = `${request.home}\0${request.input.agent.id}`
  const ahead: StandbyOptions | undefined =
    typeof request.standby === 'object'
      ? request.standby
      : request.standby
        ? {wanted: () => true, log: (line: string) => request.onLog?.(line)}
        : undefined
  const run = {
    input: request.input,
    llm: request.llm,
    timeoutMs: request.timeoutMs,
    signal: request.signal,
    onStderr: request.onLog,
    onStarted: request.onStarted,
  }
  const context = {log: request.onLog, signal: request.signal}
  try {
    const waitingTmp = ahead && waitingStandbyTmp(slot)
    if (waitingTmp) {
      const planned = await plan(waitingTmp, runId, context)
      const standby =
        'launch' in planned
          ? await takeStandbyAgentRun(slot, standbyShape(planned, waitingTmp), request.onLog)
          : dropStandby(slot, planned, request.onLog)
      if (standby) {
        try {
          return await standby.process.run(run)
        } finally {
          await removePrivateTmp(standby.tmpDir, request.onLog)
        }
      }
    }
    return await withPrivateTmp(
      runId,
      async (tmp) => {
        // its notes were logged already when a standby was planned for
        const planned = await plan(tmp, runId, waitingTmp ? {signal: request.signal} : context)
        return 'launch' in planned ? runAgentProcess({...planned.launch, ...run}) : planned
      },
      request.onLog,
    )
  } finally {
    // once the reply is on its way; never once the gateway is stopping
    if (ahead) {
      setStandbyBudget(request.config.gateway)
      const log = (line: string) => ahead.log(`standby agent-run of agent ${request.input.agent.id}: ${line}`)
      setImmediate(() =>
        prepareStandbyAgentRun(
          slot,
          async (tmpDir, processId) => {
            const planned = await plan(tmpDir, processId, {})
            if ('launch' in planned) return planned
            log(`not started: ${planned.ok ? 'no launch' : planned.error.message}`)
            return undefined
          },
          {level, wanted: ahead.wanted, log},
        ),
      )
    }
  }
}
