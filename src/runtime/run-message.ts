import crypto from 'node:crypto'
import type {AgentRunInput, AgentRunOutput, InboundMessage} from './agent-run/contract.js'
import {findAgent} from './config/load.js'
import type {AgentConfig, GatewayConfig, IsolationLevel, LoadedConfig} from './config/types.js'
import {failureFromError} from './agent-run/output.js'
import {isolationLevelFor, runnerFor} from './runners/index.js'
import {ensureWorkspace} from './workspace.js'

export interface RunMessageOptions {
  loaded: LoadedConfig
  agentId: string
  message: InboundMessage
  unrestricted?: boolean
  signal?: AbortSignal
  onLog?: (line: string) => void
  runId?: string
  /** More messages will follow (a running gateway): the runner may prepare the next run ahead. */
  standby?: boolean
}

export interface RunMessageResult {
  runId: string
  level: IsolationLevel
  output: AgentRunOutput
  ms: number
}

export function newRunId(): string {
  return `run_${crypto.randomBytes(8).toString('hex')}`
}

/** Secrets an agent may receive: its providers' keys and the names it lists, nothing else. */
export function secretsFor(agent: AgentConfig, config: GatewayConfig, available: Record<string, string>): Record<string, string> {
  const providerNames = [agent.provider ?? config.providers.primary, config.providers.primary, ...config.providers.fallback]
  const names = new Set([
    ...providerNames.flatMap((name) => {
      const env = config.providers.providers[name]?.api_key_env
      return env ? [env] : []
    }),
    ...agent.secrets,
  ])
  return Object.fromEntries([...names].flatMap((name) => (available[name] === undefined ? [] : [[name, available[name]]])))
}

export function buildAgentRunInput(
  loaded: LoadedConfig,
  agent: AgentConfig,
  message: InboundMessage,
  runId: string,
  workspace: string,
): AgentRunInput {
  return {
    version: 1,
    run_id: runId,
    agent,
    providers: loaded.config.providers,
    secrets: secretsFor(agent, loaded.config, loaded.secrets),
    message,
    workspace,
    redact_secrets: loaded.config.image_config.redact_secrets,
  }
}

/** Runs one message through the agent's isolation level. Run failures come back as `ok: false`, never thrown. */
export async function runMessage(options: RunMessageOptions): Promise<RunMessageResult> {
  const started = Date.now()
  const agent = findAgent(options.loaded, options.agentId)
  const runId = options.runId ?? newRunId()
  const level = isolationLevelFor(agent, options.unrestricted)
  let output: AgentRunOutput
  try {
    const prepared = ensureWorkspace(options.loaded.home, agent.id)
    const workspace = prepared.path
    for (const notice of prepared.notices) (options.onLog ?? ((line: string) => process.stderr.write(`${line}\n`)))(notice)
    const runner = await runnerFor(level)
    const timeoutSeconds = level === 'container' ? agent.container_mode.timeout_seconds : agent.timeout_seconds
    output = await runner.run({
      input: buildAgentRunInput(options.loaded, agent, options.message, runId, workspace),
      agent,
      config: options.loaded.config,
      home: options.loaded.home,
      configPath: options.loaded.path,
      workspace,
      timeoutMs: timeoutSeconds * 1000,
      signal: options.signal,
      onLog: options.onLog,
      standby: options.standby,
    })
  } catch (error) {
    output = failureFromError(runId, error)
  }
  return {runId, level, output, ms: Date.now() - started}
}
