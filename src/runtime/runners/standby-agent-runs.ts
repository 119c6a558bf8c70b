import {
  startAgentProcess,
  type AgentProcessLaunch,
  type StartedAgentProcess,
} from '../run-lifecycle/agent-run-process.js'
import {makePrivateTmp, removePrivateTmp} from '../run-lifecycle/private-tmp.js'
import {randomHex} from '../util/random.js'

/**
 * agent-run processes a running gateway starts ahead of an agent's next message: Node's start and
 * agent-run's bundle (≈ 40 ms) are then behind it, not in front of the reply. Each is under its
 * keeper and in its cgroups from the start, so a crashed gateway leaves none behind.
 */

/** An agent with no message for this long gives its standby back (an idle Node costs ≈ 40 MB). */
const STANDBY_IDLE_MS = 10 * 60_000
/** At most this many wait at once; the agent that ran longest ago loses its standby first. */
const MAX_STANDBYS = 4

interface Standby {
  key: string
  process: StartedAgentProcess
  tmpDir: string
  expiry: NodeJS.Timeout
}

/** One per slot (a gateway home's agent), in the order they were prepared. */
const standbys = new Map<string, Standby>()

/**
 * The slot's standby when it was started for the same `key` (the agent's launch, limits and
 * workspace) and is still waiting; undefined otherwise (one for another key, or that exited, is ended).
 */
export function takeStandbyAgentRun(
  slot: string,
  key: string,
): {process: StartedAgentProcess; tmpDir: string} | undefined {
  const standby = unlist(slot)
  if (!standby) return undefined
  if (standby.key === key && standby.process.ready) return standby
  void dispose(standby)
  return undefined
}

/**
 * Starts the slot's next agent-run unless one waits there. `launchFor` gets its private TMPDIR and
 * the id its keeper, cgroups and record go by (the run's own id comes with its input).
 */
export function prepareStandbyAgentRun(
  slot: string,
  key: string,
  launchFor: (tmpDir: string, processId: string) => AgentProcessLaunch,
  log: (line: string) => void,
): void {
  const waiting = standbys.get(slot)
  if (waiting?.key === key && waiting.process.ready) return
  if (waiting) void dispose(unlist(slot)!)
  if (standbys.size >= MAX_STANDBYS) void dispose(unlist(standbys.keys().next().value as string)!)
  const processId = `run_${randomHex(8)}`
  let tmpDir: string | undefined
  let started: StartedAgentProcess
  // it runs after a reply, on its own: a full or missing TMPDIR is logged, never the gateway's end
  try {
    tmpDir = makePrivateTmp(processId)
    started = startAgentProcess({...launchFor(tmpDir, processId), onStderr: log})
  } catch (error) {
    log(`could not start a standby agent-run: ${(error as Error).message}`)
    if (tmpDir) void removePrivateTmp(tmpDir, log)
    return
  }
  const standby: Standby = {
    key,
    process: started,
    tmpDir,
    expiry: setTimeout(() => {
      if (standbys.get(slot) === standby) void dispose(unlist(slot)!)
    }, STANDBY_IDLE_MS).unref(),
  }
  standbys.set(slot, standby)
}

/** Takes the slot's standby off the list (and its idle timer off): the caller uses or ends it. */
function unlist(slot: string): Standby | undefined {
  const standby = standbys.get(slot)
  if (!standby) return undefined
  standbys.delete(slot)
  clearTimeout(standby.expiry)
  return standby
}

async function dispose(standby: {process: StartedAgentProcess; tmpDir: string}): Promise<void> {
  await standby.process.discard()
  // a start-up reclaims what is left (its name carries this process's pid)
  await removePrivateTmp(standby.tmpDir)
}

/** Ends the standby agent-runs of this process: those of one gateway home (it stops, or its config changed), or all. */
export async function stopStandbyAgentRuns(home?: string): Promise<void> {
  const ending = [...standbys.keys()]
    .filter((slot) => home === undefined || slot.startsWith(`${home}\0`))
    .map((slot) => unlist(slot)!)
  await Promise.all(ending.map(dispose))
}
