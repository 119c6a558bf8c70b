export type ProviderKind = 'anthropic' | 'openai'
export type IsolationLevel = 'container' | 'host-sandbox' | 'unrestricted'
export type ContainerNetwork = 'bridge' | 'none' | 'host'

export interface ProviderConfig {
  kind: ProviderKind
  api_key_env?: string
  model: string
  base_url?: string
  max_tokens?: number
  stream?: boolean
  /** Retries after the first attempt on 429 / 5xx / network errors. */
  max_retries?: number
  timeout_seconds?: number
}

export interface ProvidersConfig {
  primary: string
  fallback: string[]
  providers: Record<string, ProviderConfig>
}

export interface CaptainConfig {
  enabled: boolean
  bind: string
  port: number
  /** Host names (besides loopback ones) requests may name in their Host header. */
  allowed_hosts: string[]
}

export interface ImageConfig {
  enabled: boolean
  image: string
  base_image: string
  packages: string[]
  env_vars: Record<string, string>
  inject_credentials_env: boolean
  inject_secrets_env: boolean
  redact_secrets: boolean
}

export interface ContainerModeConfig {
  enabled: boolean
  image: string
  memory_limit: string
  timeout_seconds: number
  network: ContainerNetwork
  pids_limit: number
  /** docker run --cpus. */
  cpus: number
  /**
   * "UID[:GID]" the container runs as; unset: the gateway's own uid, or an unprivileged one when
   * the gateway is root.
   */
  user?: string
  /** Under `serve`, keep the agent's next container started and waiting (see the container runner). */
  standby: boolean
  /** Names from the gateway's `engines:` its runs may go to; unset: any of them. */
  engines?: string[]
}

/**
 * A Docker engine container runs may go to: `host` (unix://, tcp:// with mutual TLS, ssh://) or a
 * docker `context`. Without an `engines:` list the local engine (DOCKER_HOST, else the default socket) runs everything.
 */
export interface EngineConfig {
  name: string
  host?: string
  context?: string
  kind: 'docker' | 'podman'
  /** Runs at once on this engine; a full engine gets no new run. */
  max_runs: number
  /** Paths of the PEM files: the CA the engine's certificate must be signed by, and the client's pair. */
  tls?: {ca: string; cert: string; key: string}
  /** tcp:// without TLS: anyone who reaches the port owns the engine (flagged by config check and serve). */
  insecure: boolean
  /**
   * Where the engine cannot apply a limit (rootless Podman without a delegated cgroup controller,
   * a Docker engine that cannot attach limits.disk's image), run without it and say so; unset,
   * such runs are refused naming the limit.
   */
  best_effort: boolean
  /**
   * Over ssh:// (or a context that resolves to it): the known_hosts file the engine's host key must
   * be in (default: the user's own) and the private key to log in with (default: the ssh config's).
   */
  ssh?: {known_hosts?: string; identity?: string}
}

/**
 * Resource limits of one run at every level (the host levels through a cgroup per run where the
 * host allows one, containers through the engine). Sizes look like 512m or 2g.
 */
export interface LimitsConfig {
  memory: string
  pids: number
  cpus: number
  /** The workspace's size limit (see src/runtime/run-lifecycle/disk-limit.ts). */
  disk: string
}

/**
 * Caps on the files of one message, the same in both directions and on every connector: a file
 * over `max_file_size`, past `max_files` or past `max_total_size` is skipped and the user told.
 */
export interface AttachmentsConfig {
  max_file_size: string
  max_files: number
  max_total_size: string
  /** Days a message's received files stay in the agent's `inbox/<message id>/` before the gateway removes them. */
  inbox_retention_days: number
}

export interface FileAccessConfig {
  unrestricted: boolean
  allow_read: string[]
  allow_read_write: string[]
  deny: string[]
  allow_home_dotfiles: boolean
  allow_network: boolean
  /**
   * Sandboxed commands may bind TCP/UDP ports and listen (off: a local server could be reached by
   * the operator's browser).
   */
  allow_listen: boolean
  best_effort: boolean
}

/** Who an agent listens to on a connector; unset, every channel the bot is in, mentioned or not. */
export interface ConnectorAudience {
  /** Channel ids the agent answers in (a thread counts as its parent channel); DMs always. */
  channels?: string[]
  /** In channels, answer only messages that @mention the bot; DMs always. */
  mention_only?: boolean
}

export type ConnectorConfig = ConnectorAudience &
  (
    | {type: 'meepachat'; url: string; bot_token: string; tls_verify?: boolean}
    | {type: 'discord'; bot_token: string; guild_ids: string[]; api_url?: string}
    | {type: 'slack'; bot_token: string; app_token: string; api_url?: string}
  )

/** An agent with every field resolved: agent field, then agent_defaults, then built-in default. */
export interface AgentConfig {
  id: string
  name: string
  provider?: string
  model?: string
  max_iterations: number
  /** Host-side wall clock limit for one message in the host sandbox and unrestricted levels. */
  timeout_seconds: number
  container_mode: ContainerModeConfig
  file_access: FileAccessConfig
  /** Limits of every level; container_mode.memory_limit / pids_limit, when set, win for containers. */
  limits: LimitsConfig
  attachments: AttachmentsConfig
  connectors: ConnectorConfig[]
  /** Secret names (environment variables) this agent may receive besides provider keys. */
  secrets: string[]
}

export interface GatewayConfig {
  providers: ProvidersConfig
  captain: CaptainConfig
  image_config: ImageConfig
  agents: AgentConfig[]
  /** Unset or empty: the local engine only. */
  engines?: EngineConfig[]
  gateway: {
    max_concurrent_runs: number
    queue_limit: number
    shutdown_grace_seconds: number
    /** Standby agent-runs and containers held at once, every level together (0: none). */
    max_standbys: number
    /** A standby whose message has not come after this long is ended. */
    standby_idle_minutes: number
    /** How long a chat reply is retried (across reconnects and restarts) before it counts as undeliverable. */
    reply_delivery_minutes: number
    /** Bytes of files web chat messages waiting for their run may hold in the gateway's memory, all agents together (`256m`). */
    max_queued_chat_files_size: string
    /** Bytes of reply files the outbox's spool may keep until they are delivered (`1g`). */
    max_outbox_spool_size: string
  }
}

/** What loadConfig returns: the resolved config plus where it came from. */
export interface LoadedConfig {
  config: GatewayConfig
  path: string
  home: string
  /** Secret values read from the environment ($NAME references and providers' api_key_env), by name. */
  secrets: Record<string, string>
  /** True when this load wrote the default config because none existed. */
  created: boolean
  /**
   * The file's text this was parsed from (`send` hands a gateway its message only when its file
   * still reads the same).
   */
  text?: string
}
