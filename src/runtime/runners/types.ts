import type {AgentRunInput, AgentRunOutput} from '../shapes/agent-run-contract.js'
import type {GatewayConfig, IsolationLevel} from '../config/types.js'
import type {HostLlm} from '../llm-channel/host.js'

/** What a running gateway says about the runs it prepares ahead. */
export interface StandbyOptions {
  /** False once the gateway is stopping: nothing is prepared after that. */
  wanted(): boolean
  /** The gateway's log, for a prepared run's lines before a message takes it. */
  log(line: string): void
}

/** Everything a runner needs to run one message for one agent. */
export interface RunRequest {
  /**
   * What agent-run gets on stdin: no provider key (they stay with `llm`). The agent and its
   * workspace's host path are read from here.
   */
  input: AgentRunInput
  /** The agent's providers, called on the host for each llm_request agent-run sends. */
  llm: HostLlm
  config: GatewayConfig
  /** MEEPAGATEWAY_HOME: the runner must keep it out of the agent's reach. */
  home: string
  /** The config file actually loaded (--config may put it outside MEEPAGATEWAY_HOME); kept out of reach too. */
  configPath?: string
  /** Wall-clock limit for the whole run; past it the run and everything it started is killed. */
  timeoutMs: number
  signal?: AbortSignal
  /** Progress lines for the operator (image builds, sandbox gaps in best-effort mode). */
  onLog?: (line: string) => void
  /**
   * More messages are expected (a running gateway): a runner may prepare the agent's next run
   * ahead of time (container mode starts a standby container, unrestricted a standby agent-run).
   */
  standby?: boolean | StandbyOptions
  /** Called once the run is under way (its process started, its input given): work that must not hold up its start. */
  onStarted?: () => void
}

/**
 * One isolation level. Every level runs the same `meepagateway agent-run` with the same
 * stdin/stdout contract (docs/agent-run.md), serving its LLM channel; a runner only decides where
 * it runs and how it is killed.
 * A runner never throws for a failed run: it returns `{ok: false}` with a code
 * (E_TIMEOUT, E_OOM, E_SANDBOX, ...) so the gateway can reply to the user and record it.
 */
export interface Runner {
  readonly level: IsolationLevel
  run(request: RunRequest): Promise<AgentRunOutput>
}
