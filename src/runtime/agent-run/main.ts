import {GatewayError, toGatewayError} from '../errors.js'
import {redactSecrets} from '../redact.js'
import {withoutSecrets} from './env.js'
import {containerOomKills, STANDBY_ENV} from './in-container.js'
import {failureFromError, outOfMemory} from './output.js'
import type {AgentRunInput, AgentRunOutput} from './contract.js'
import {MAX_INPUT_BYTES, parseAgentRunInput} from './input.js'

async function readStdin(): Promise<string> {
  const chunks: Buffer[] = []
  let size = 0
  for await (const chunk of process.stdin) {
    size += (chunk as Buffer).length
    if (size > MAX_INPUT_BYTES) throw new GatewayError('E_INPUT', `stdin is larger than ${MAX_INPUT_BYTES} bytes`)
    chunks.push(chunk as Buffer)
  }
  return Buffer.concat(chunks).toString('utf8')
}

/** Loaded lazily, so a malformed input is answered without loading SDKs and SQLite. */
function loadRunModules() {
  return Promise.all([import('../agent/loop.js'), import('../memory.js'), import('../providers/index.js')])
}

/**
 * A standby container waits for its message, maybe for minutes: it spends the wait loading what
 * any run may need, every provider SDK included, so the message finds it all ready.
 */
async function preloadForStandby(): Promise<void> {
  const [, , {preloadProviders}] = await loadRunModules()
  await preloadProviders()
  // Both SDKs build every request's headers with it, and its first use loads Node's fetch classes (~20 ms).
  void new Headers()
}

/** Runs one agent-run input; never throws: every failure becomes the contract's error object. */
export async function executeAgentRun(input: AgentRunInput, log: (line: string) => void): Promise<AgentRunOutput> {
  const secretValues = Object.values(input.secrets)
  const redact = input.redact_secrets === false ? (text: string) => text : (text: string) => redactSecrets(text, secretValues)
  const [{runAgentLoop}, {openMemory}, {createProviderChain}] = await loadRunModules()
  const oomKillsBefore = containerOomKills()
  let memory
  try {
    const chain = createProviderChain(input.providers, input.secrets, {provider: input.agent.provider, model: input.agent.model})
    memory = openMemory(input.workspace, {onRecovered: log})
    const injected = new Set(input.env_secrets ?? [])
    const env = withoutSecrets(process.env, Object.fromEntries(Object.entries(input.secrets).filter(([name]) => !injected.has(name))))
    const output = await runAgentLoop(input, {chat: (request) => chain.chat(request), memory, redact, log, env})
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

/** `meepagateway agent-run`: one JSON object in on stdin, one out on stdout, logs on stderr. */
export async function main(): Promise<void> {
  const stdout = process.stdout
  // Only the result may reach stdout: anything a library prints goes to stderr.
  console.log = console.error
  console.info = console.error
  let runId = 'unknown'
  let secrets: string[] = []
  const log = (line: string) => process.stderr.write(`[agent-run ${runId}] ${redactSecrets(line, secrets)}\n`)
  let output: AgentRunOutput
  if (process.env[STANDBY_ENV] === '1') preloadForStandby().catch((error: unknown) => log(`preloading failed: ${String(error)}`))
  try {
    const input = parseAgentRunInput(await readStdin())
    runId = input.run_id
    secrets = Object.values(input.secrets)
    output = await executeAgentRun(input, log)
  } catch (error) {
    const gatewayError = toGatewayError(error, 'E_INTERNAL')
    if (gatewayError.code === 'E_INTERNAL') log(`internal error: ${gatewayError.stack ?? gatewayError.message}`)
    output = {version: 1, ok: false, run_id: runId, error: {code: gatewayError.code, message: gatewayError.message, retryable: false}}
  }
  stdout.write(`${JSON.stringify(output)}\n`, () => {
    process.exit(output.ok ? 0 : output.error.code === 'E_INPUT' ? 2 : 1)
  })
}
