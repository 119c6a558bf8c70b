import {GatewayError, toGatewayError} from '../util/errors.js'
import {redactSecrets} from '../util/redact.js'
import type {ChatRequest, ChatResponse} from '../shapes/provider-types.js'
import type {AgentRunFrame} from './channel.js'
import {LLM_CHANNEL_VERSION} from './channel.js'
import {withoutSecrets} from './env.js'
import {containerOomKills} from './in-container.js'
import {failureFromError, outOfMemory} from './output.js'
import type {AgentRunInput, AgentRunOutput} from '../shapes/agent-run-contract.js'
import {parseAgentRunInput} from './input.js'
import {RunnerChannel, StdinReader} from './runner-channel.js'
import {
  LOST_VOLUME_EXIT,
  LostVolume,
  markRunStart,
  namesBeforeGo,
  type NamesBeforeGo,
  type RunStart,
  sendWorkspaceChanges,
  SYNC_START_LOG,
  SYNC_TAKEN_WAIT_MS,
  stopOtherProcesses,
  SYNC_WARM_UP_AFTER_MS,
  warmWorkspaceSync,
  WORKSPACE_SYNC_ENV,
  workspaceSyncHere,
} from './workspace-changes.js'

let runModules: Promise<[typeof import('../agent/loop.js'), typeof import('../workspace/memory.js')]> | undefined

/**
 * The loop and SQLite, loaded once; main() starts loading them while the input is on its way (a
 * runner holds it back until the run is in its cgroups; a standby container waits for its message).
 */
function loadRunModules() {
  return (runModules ??= Promise.all([import('../agent/loop.js'), import('../workspace/memory.js')]))
}

/** How agent-run reaches its LLM: through its runner (channel mode), or itself (run by hand). */
export interface LlmAccess {
  chat(request: ChatRequest): Promise<ChatResponse>
  /** Provider keys agent-run holds itself (direct mode only): kept out of shell commands and scrubbed. */
  keys: Record<string, string>
  /** Fires when the run has nobody left to answer it (channel mode: the runner went away). */
  aborted?: AbortSignal
}

/**
 * Run by hand (`echo '<input>' | meepagateway agent-run`, no llm_channel in the input): agent-run
 * calls the providers itself with the keys of the invoking shell's environment.
 */
async function directLlm(input: AgentRunInput, env: NodeJS.ProcessEnv = process.env): Promise<LlmAccess> {
  const {createProviderChain} = await import('../providers/index.js')
  const keys: Record<string, string> = {}
  for (const provider of Object.values(input.providers.providers)) {
    const name = provider.api_key_env
    if (name && env[name]) keys[name] = env[name]
  }
  const chain = createProviderChain(input.providers, keys, {provider: input.agent.provider, model: input.agent.model})
  chain.warm()
  return {chat: (request) => chain.chat(request), keys}
}

/** Runs one agent-run input; never throws: every failure becomes the contract's error object. */
export async function executeAgentRun(
  input: AgentRunInput,
  log: (line: string) => void,
  llm: LlmAccess,
): Promise<AgentRunOutput> {
  const secretValues = [...Object.values(input.secrets), ...Object.values(llm.keys)]
  const redact =
    input.redact_secrets === false ? (text: string) => text : (text: string) => redactSecrets(text, secretValues)
  const [{runAgentLoop}, {openMemory}] = await loadRunModules()
  const oomKillsBefore = containerOomKills()
  let memory
  try {
    memory = openMemory(input.workspace, {onRecovered: log})
    const injected = new Set(input.env_secrets ?? [])
    const hidden = {
      ...llm.keys,
      ...Object.fromEntries(Object.entries(input.secrets).filter(([name]) => !injected.has(name))),
    }
    const env = withoutSecrets(process.env, hidden)
    const output = await runAgentLoop(input, {
      chat: (request) => llm.chat(request),
      memory,
      redact,
      log,
      env,
      signal: llm.aborted,
    })
    return killedForMemory(input, oomKillsBefore) ?? output
  } catch (error) {
    const output = killedForMemory(input, oomKillsBefore) ?? failureFromError(input.run_id, error)
    return JSON.parse(redact(JSON.stringify(output))) as AgentRunOutput
  } finally {
    try {
      memory?.close()
    } catch (error) {
      log(`could not close memory.db: ${(error as Error).message}`)
    }
  }
}

/** A run in which the kernel killed a process for memory fails as E_OOM, whatever the agent said after. */
function killedForMemory(input: AgentRunInput, before: number | undefined): AgentRunOutput | undefined {
  const after = containerOomKills()
  if (before === undefined || after === undefined || after <= before) return undefined
  return outOfMemory(input.run_id, input.agent.container_mode.memory_limit, {oom_kills: after - before})
}

/** Whether the input asks for channel mode; an llm_channel this build does not speak is an input error. */
function channelMode(input: AgentRunInput): boolean {
  if (input.llm_channel === undefined) return false
  if (input.llm_channel === LLM_CHANNEL_VERSION) return true
  throw new GatewayError(
    'E_INPUT',
    `llm_channel ${JSON.stringify(input.llm_channel)} is not supported (this agent-run speaks ${LLM_CHANNEL_VERSION})`,
    {
      suggestions: [
        'the gateway and the agent-run it starts come from different builds: rebuild the isolation image (meepagateway container build)',
      ],
    },
  )
}

/**
 * The run's own deadline: agent-run ends itself, and in a container (whose init exits with it)
 * every process of the run goes too, even when nothing outside can stop it (a dead engine).
 */
function endAtDeadline(ms: number, log: (line: string) => void): void {
  setTimeout(() => {
    log(`the run's deadline (${Math.round(ms / 1000)} s) passed: ending it`)
    process.kill(process.pid, 'SIGKILL')
  }, ms).unref()
}

/**
 * `meepagateway agent-run` (docs/agent-run.md): the input on stdin; logs on stderr. With
 * `llm_channel` it asks its runner for every LLM call and ends with a result frame; without, it
 * calls the providers itself and prints the bare output object.
 */
export async function main(): Promise<void> {
  const stdout = process.stdout
  // Only frames may reach stdout: anything a library prints goes to stderr.
  console.log = console.error
  console.info = console.error
  let runId = 'unknown'
  let secrets: string[] = []
  let channel = false
  // made and written now, while a standby waits, not before a run's first request: Node makes each
  // stream at first use (≈ 0.5–1 ms) and its first write to a pipe costs ≈ 0.5 ms; empty, it sends nothing
  const stderr = process.stderr
  stderr.write('')
  stdout.write('')
  const log = (line: string) => stderr.write(`[agent-run ${runId}] ${redactSecrets(line, secrets)}\n`)
  const writeFrame = (frame: AgentRunFrame) => stdout.write(`${JSON.stringify(frame)}\n`)
  let output: AgentRunOutput
  loadRunModules().catch(() => {}) // a failure is the run's, reported where it awaits them
  // a sync engine's run: a go line before the input, the run's changes after its result
  const syncAsked = process.env[WORKSPACE_SYNC_ENV] === '1'
  const sendsChanges = syncAsked && workspaceSyncHere()
  delete process.env[WORKSPACE_SYNC_ENV]
  // while a standby waits, its message's mark and trailer then run as warm code; a cold run's go
  // line is there at once, and it goes on without
  let syncWarmed: Promise<void> | undefined
  // and takes the workspace's names then (its working directory), which a clean go line starts from
  let namesTaken: NamesBeforeGo | undefined
  const warmUp = syncAsked
    ? setTimeout(
        () =>
          (syncWarmed = warmWorkspaceSync()
            .catch(() => {})
            .then(() => void (namesTaken = namesBeforeGo()))),
        SYNC_WARM_UP_AFTER_MS,
      ).unref()
    : undefined
  let changesSince: {workspace: string; start: RunStart} | undefined
  const reader = new StdinReader(process.stdin, {goLine: syncAsked})
  try {
    const goLine = syncAsked ? await reader.goLine : undefined
    clearTimeout(warmUp)
    const input = parseAgentRunInput(await reader.input)
    runId = input.run_id
    if (goLine !== undefined) {
      await syncWarmed
      changesSince = {workspace: input.workspace, start: markRunStart(input.workspace, goLine, namesTaken)}
      // for the host's own listing, should no whole trailer come: said before any command runs
      log(`${SYNC_START_LOG} ${changesSince.start.since}`)
    }
    secrets = Object.values(input.secrets)
    if (input.timeout_ms !== undefined) endAtDeadline(input.timeout_ms, log)
    channel = channelMode(input)
    let llm: LlmAccess
    if (channel) {
      const runner = new RunnerChannel(reader, writeFrame)
      llm = {chat: (request) => runner.chat(request), keys: {}, aborted: runner.aborted}
    } else {
      llm = await directLlm(input)
      secrets.push(...Object.values(llm.keys))
    }
    output = await executeAgentRun(input, log, llm)
  } catch (error) {
    // nothing of the run started: no frame, the status and mark the runner places it again on
    if (error instanceof LostVolume) {
      stderr.write(`${error.message}\n`, () => process.exit(LOST_VOLUME_EXIT))
      return
    }
    const gatewayError = toGatewayError(error, 'E_INTERNAL')
    if (gatewayError.code === 'E_INTERNAL') log(`internal error: ${gatewayError.stack ?? gatewayError.message}`)
    output = {
      version: 1,
      ok: false,
      run_id: runId,
      error: {code: gatewayError.code, message: gatewayError.message, retryable: false},
    }
  }
  const line = channel ? JSON.stringify({type: 'result', output} satisfies AgentRunFrame) : JSON.stringify(output)
  // the result first, whatever comes after: at the run's deadline the host keeps an answer it has
  stdout.write(`${line}\n`)
  // a failed run's changes too: the host takes back what any run that answered wrote
  if (changesSince && sendsChanges) {
    if (!(await stopOtherProcesses()))
      log('processes of the run outlived their kill: the host lists the changes itself')
    else {
      const sent = await sendWorkspaceChanges(changesSince.workspace, changesSince.start, stdout).then(
        () => true,
        (error: unknown) => {
          // the trailer stays unfinished: the runner lists the changes again from the volume
          log(`could not send the workspace's changes: ${(error as Error).message}`)
          return false
        },
      )
      // the container's teardown waits until the host has taken them (SYNC_TAKEN)
      if (sent) await reader.nextLineOrEnd(SYNC_TAKEN_WAIT_MS)
    }
  }
  stdout.write('', () => {
    process.exit(output.ok ? 0 : output.error.code === 'E_INPUT' ? 2 : 1)
  })
}
