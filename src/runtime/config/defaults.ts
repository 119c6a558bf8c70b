import type {AgentConfig, CaptainConfig, GatewayConfig, ImageConfig} from './types.js'

export const DEFAULT_CAPTAIN: CaptainConfig = {enabled: true, bind: '127.0.0.1', port: 63372, allowed_hosts: []}

export const DEFAULT_IMAGE_CONFIG: ImageConfig = {
  enabled: false,
  image: '',
  base_image: 'debian:bookworm-slim',
  packages: [],
  env_vars: {},
  inject_credentials_env: false,
  inject_secrets_env: true,
  redact_secrets: true,
}

export const DEFAULT_GATEWAY: GatewayConfig['gateway'] = {
  max_concurrent_runs: 4,
  queue_limit: 50,
  shutdown_grace_seconds: 30,
  max_standbys: 8,
  standby_idle_minutes: 10,
  reply_delivery_minutes: 15,
  max_queued_chat_files_size: '256m',
  max_outbox_spool_size: '1g',
}

/** Built-in agent defaults: the last step of agent field > agent_defaults > built-in default. */
export const DEFAULT_AGENT: Omit<AgentConfig, 'id' | 'name'> = {
  max_iterations: 20,
  timeout_seconds: 300,
  container_mode: {
    enabled: false,
    image: '',
    memory_limit: '512m',
    timeout_seconds: 300,
    network: 'bridge',
    pids_limit: 256,
    cpus: 1,
    standby: true,
  },
  file_access: {
    unrestricted: false,
    allow_read: [],
    allow_read_write: [],
    deny: [],
    allow_home_dotfiles: false,
    allow_network: true,
    allow_listen: false,
    best_effort: false,
  },
  limits: {memory: '512m', pids: 256, cpus: 1, disk: '1g'},
  attachments: {max_file_size: '25m', max_files: 10, max_total_size: '50m', inbox_retention_days: 7},
  connectors: [],
  secrets: [],
}

/** Written on first use when no config exists: one agent, one provider, every knob commented. */
export const DEFAULT_CONFIG_YAML = `# meepagateway configuration. Validate with: meepagateway config check
# Values like $NAME or \${NAME} are read from the environment when the config loads:
# keep secrets in the environment, not in this file.

providers:
  primary: anthropic
  fallback: []            # e.g. [openai]: tried in order when the primary fails
  providers:
    anthropic:
      kind: anthropic
      api_key_env: ANTHROPIC_API_KEY
      model: claude-sonnet-4-5
      max_tokens: 4096
    # openai:
    #   kind: openai
    #   api_key_env: OPENAI_API_KEY
    #   model: gpt-4o
    # ollama:                      # any OpenAI-compatible server
    #   kind: openai
    #   model: llama3.1
    #   base_url: http://127.0.0.1:11434/v1

captain:
  enabled: true
  bind: 127.0.0.1
  port: 63372
  # Host names (besides 127.0.0.1/localhost) browsers may use to reach the dashboard; others get 421
  # allowed_hosts: [gateway.lan]

image_config:
  enabled: false
  base_image: debian:bookworm-slim
  packages: []             # e.g. [git, python3]
  env_vars: {}
  inject_credentials_env: false   # provider keys stay on the host; true also sets them in containers, for the agent's own tools
  inject_secrets_env: true
  redact_secrets: true

agent_defaults:
  max_iterations: 20
  # container_mode: {enabled: true, memory_limit: 512m, cpus: 1, timeout_seconds: 300, network: bridge}
  # file_access: {allow_read: [], allow_read_write: [], deny: [], allow_network: true, allow_listen: false}
  # limits: {memory: 512m, pids: 256, cpus: 1, disk: 1g}   # every level; meepagateway sandbox explain shows what is enforced
  # attachments: {max_file_size: 25m, max_files: 10, max_total_size: 50m, inbox_retention_days: 7}   # files per message, in and out, every connector

agents:
  - id: meepa
    name: Meepa
    # connectors:
    #   - {type: discord, bot_token: $DISCORD_BOT_TOKEN, guild_ids: []}
    #   - {type: slack, bot_token: $SLACK_BOT_TOKEN, app_token: $SLACK_APP_TOKEN}
    #   - {type: meepachat, url: wss://chat.example/api/bot-gateway, bot_token: $MEEPACHAT_BOT_TOKEN}
`
