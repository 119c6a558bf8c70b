import type {AgentRunInput, AgentRunOutput, InboundMessage} from '../shapes/agent-run-contract.js'
import {findAgent} from '../config/load.js'
import type {AgentConfig, GatewayConfig, IsolationLevel, LoadedConfig} from '../config/types.js'
import {failureFromError} from '../agent-run/output.js'
import {runnerFor} from './index.js'
import type {StandbyOptions} from './types.js'
import {isolationLevelFor} from '../shapes/isolation-level.js'
import {hostLlmFor, providerKeysFor} from '../llm-channel/host.js'
import {readyWorkspace} from '../workspace/workspace.js'
import {redactSecrets} from '../util/redact.js'
import {randomHex} from '../util/random.js'

export interface RunMessageOptions {
  loaded: LoadedConfig
  agentId: string
  message: InboundMessage
  unrestricted?: boolean
  /** The level already worked out for this message (the gateway records it first); else from the agent. */
  level?: IsolationLevel
  signal?: AbortSignal
  onLog?: (line: string) => void
  runId?: string
  /** More messages will follow (a running gateway): the runner may prepare the next run ahead. */
  standby?: boolean | StandbyOptions
  /** Called once the run is under way (its process started, its input given): work that must not hold up its start. */
  onStarted?: () => void
}

export interface RunMessageResult {
  runId: string
  level: IsolationLevel
  output: AgentRunOutput
  ms: number
}

export function newRunId(): string {
  return `run_${randomHex(8)}`
}

/** The secrets of one agent's run, worked out once per message. */
export interface AgentSecrets {
  /** Every secret the gateway was given (the environment's values of the names config.yaml lists). */
  available: Record<string, string>
  /** The keys of the agent's provider chain (providerKeysFor): they stay with the runner. */
  providerKeys: Record<string, string>
}

/**
 * Secrets that go into agent-run's input: the names the agent lists. Provider keys stay on the host
 * (the runner makes the LLM calls) unless the operator asks for them in the container with
 * image_config.inject_credentials_env, for the agent's own tools.
 */
export function secretsFor(
  agent: AgentConfig,
  config: GatewayConfig,
  secrets: AgentSecrets,
  level: IsolationLevel,
): Record<string, string> {
  const {available} = secrets
  const providerKeys = new Set(
    Object.values(config.providers.providers).flatMap((provider) =>
      provider.api_key_env ? [provider.api_key_env] : [],
    ),
  )
  const keysInside = level === 'container' && config.image_config.inject_credentials_env
  const names = new Set([
    ...agent.secrets.filter((name) => keysInside || !providerKeys.has(name)),
    ...(keysInside ? Object.keys(secrets.providerKeys) : []),
  ])
  return Object.fromEntries(
    [...names].flatMap((name) => (available[name] === undefined ? [] : [[name, available[name]]])),
  )
}

export function buildAgentRunInput(
  loaded: LoadedConfig,
  agent: AgentConfig,
  message: InboundMessage,
  runId: string,
  workspace: string,
  level: IsolationLevel,
  secrets: AgentSecrets,
): AgentRunInput {
  return {
    version: 1,
    run_id: runId,
    // connectors hold the chat platforms' tokens (resolved from the environment): the gateway's, never the sandbox's
    agent: {...agent, connectors: []},
    providers: loaded.config.providers,
    secrets: secretsFor(agent, loaded.config, secrets, level),
    message,
    workspace,
    redact_secrets: loaded.config.image_config.redact_secrets,
  }
}

/** Every secret value an agent's run involves: its own secrets and its providers' keys. */
function agentSecretValues(agent: AgentConfig, secrets: AgentSecrets): string[] {
  const own = agent.secrets.flatMap((name) => (secrets.available[name] === undefined ? [] : [secrets.available[name]]))
  return [...own, ...Object.values(secrets.providerKeys)]
}

/**
 * With redact_secrets, no secret value of the agent (its own, its provider keys) leaves a run:
 * reply, error message and details.
 */
function redactOutput(output: AgentRunOutput, secrets: string[]): AgentRunOutput {
  if (secrets.length === 0) return output
  const scrub = (value: unknown): unknown => {
    if (typeof value === 'string') return redactSecrets(value, secrets)
    if (Array.isArray(value)) return value.map(scrub)
    if (value && typeof value === 'object')
      return Object.fromEntries(Object.entries(value).map(([key, item]) => [key, scrub(item)]))
    return value
  }
  return scrub(output) as AgentRunOutput
}

/** Runs one message through the agent's isolation level. Run failures come back as `ok: false`, never thrown. */
export async function runMessage(options: RunMessageOptions): Promise<RunMessageResult> {
  const started = Date.now()
  const agent = findAgent(options.loaded, options.agentId)
  const runId = options.runId ?? newRunId()
  const level = options.level ?? isolationLevelFor(agent, options.unrestricted)
  const secrets: AgentSecrets = {
    available: options.loaded.secrets,
    providerKeys: providerKeysFor(agent, options.loaded.config, options.loaded.secrets),
  }
  let output: AgentRunOutput
  try {
    const workspace = (await readyWorkspace(options.loaded.home, agent.id, agent.limits.disk)).path
    const runner = await runnerFor(level)
    const timeoutSeconds = level === 'container' ? agent.container_mode.timeout_seconds : agent.timeout_seconds
    output = await runner.run({
      input: buildAgentRunInput(options.loaded, agent, options.message, runId, workspace, level, secrets),
      llm: hostLlmFor(agent, options.loaded.config, secrets.providerKeys),
      config: options.loaded.config,
      home: options.loaded.home,
      configPath: options.loaded.path,
      timeoutMs: timeoutSeconds * 1000,
      signal: options.signal,
      onLog: options.onLog,
      standby: options.standby,
      onStarted: options.onStarted,
    })
  } catch (error) {
    output = failureFromError(runId, error)
  }
  if (options.loaded.config.image_config.redact_secrets !== false)
    output = redactOutput(output, agentSecretValues(agent, secrets))
  return {runId, level, output, ms: Date.now() - started}
}
