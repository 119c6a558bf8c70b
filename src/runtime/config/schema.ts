/** The JSON Schema of config.yaml (draft-07). `meepagateway config schema` prints it for editors. */
const stringList = {type: 'array', items: {type: 'string'}, default: []} as const

export const AGENT_ID_PATTERN = '^[a-z0-9][a-z0-9-]{0,62}$'

const providerSchema = {
  type: 'object',
  additionalProperties: false,
  required: ['kind', 'model'],
  properties: {
    kind: {enum: ['anthropic', 'openai']},
    api_key_env: {type: 'string', pattern: '^[A-Za-z_][A-Za-z0-9_]*$'},
    model: {type: 'string', minLength: 1},
    base_url: {type: 'string', pattern: '^https?://'},
    max_tokens: {type: 'integer', minimum: 1},
    stream: {type: 'boolean'},
    max_retries: {type: 'integer', minimum: 0, maximum: 10},
    timeout_seconds: {type: 'number', exclusiveMinimum: 0},
  },
}

const containerModeSchema = {
  type: 'object',
  additionalProperties: false,
  properties: {
    enabled: {type: 'boolean'},
    image: {type: 'string'},
    memory_limit: {type: 'string', pattern: '^[0-9]+[kmg]$'},
    timeout_seconds: {type: 'number', exclusiveMinimum: 0},
    network: {enum: ['bridge', 'none', 'host']},
    pids_limit: {type: 'integer', minimum: 16},
    cpus: {type: 'number', exclusiveMinimum: 0},
    user: {type: 'string', pattern: '^[0-9]+(:[0-9]+)?$'},
    standby: {type: 'boolean'},
    // names from the gateway's `engines:` list this agent's runs may go to (default: any)
    engines: {type: 'array', items: {type: 'string', minLength: 1}, minItems: 1},
  },
}

const absolutePath = {type: 'string', pattern: '^/'} as const

/** One Docker engine container runs may go to (docs/architecture.md, "Engines"). */
const engineSchema = {
  type: 'object',
  additionalProperties: false,
  required: ['name'],
  properties: {
    name: {type: 'string', pattern: '^[a-z0-9][a-z0-9-]{0,30}$'},
    host: {type: 'string', pattern: '^(unix|tcp|ssh)://'},
    context: {type: 'string', minLength: 1},
    kind: {enum: ['docker', 'podman']},
    max_runs: {type: 'integer', minimum: 1},
    tls: {
      type: 'object',
      additionalProperties: false,
      required: ['ca', 'cert', 'key'],
      // absolute paths of PEM files on the gateway's machine
      properties: {ca: absolutePath, cert: absolutePath, key: absolutePath},
    },
    insecure: {type: 'boolean'},
    // run where the engine cannot apply a limit (rootless Podman without the cgroup controller, a
    // Docker engine that cannot attach limits.disk's image), saying so
    best_effort: {type: 'boolean'},
    // an ssh:// engine's host keys (always checked) and the key the gateway logs in with
    ssh: {
      type: 'object',
      additionalProperties: false,
      properties: {known_hosts: absolutePath, identity: absolutePath},
    },
  },
}

const limitsSchema = {
  type: 'object',
  additionalProperties: false,
  properties: {
    memory: {type: 'string', pattern: '^[0-9]+[kmg]$'},
    pids: {type: 'integer', minimum: 16},
    cpus: {type: 'number', exclusiveMinimum: 0, maximum: 1024},
    disk: {type: 'string', pattern: '^[0-9]+[kmg]$'},
  },
}

/** Files a message may carry, in and out, on every connector (see src/runtime/connectors/attachments.ts). */
const attachmentsSchema = {
  type: 'object',
  additionalProperties: false,
  properties: {
    max_file_size: {type: 'string', pattern: '^[0-9]+[kmg]$'},
    max_files: {type: 'integer', minimum: 0, maximum: 100},
    max_total_size: {type: 'string', pattern: '^[0-9]+[kmg]$'},
    inbox_retention_days: {
      type: 'number',
      exclusiveMinimum: 0,
      description:
        "Days a message's received files are kept in the agent's workspace (inbox/<message id>/); the gateway then removes the folder. Checked at start and every hour.",
    },
  },
}

const fileAccessSchema = {
  type: 'object',
  additionalProperties: false,
  properties: {
    unrestricted: {type: 'boolean'},
    allow_read: stringList,
    allow_read_write: stringList,
    deny: stringList,
    allow_home_dotfiles: {type: 'boolean'},
    allow_network: {type: 'boolean'},
    allow_listen: {type: 'boolean'},
    best_effort: {type: 'boolean'},
  },
}

/** Who the agent listens to, on every platform: channel ids (DMs always), and in them only @mentions. */
const audienceFields = {
  channels: {
    ...stringList,
    description:
      'Channel ids the agent answers in (a thread counts as its channel); empty: every channel the bot is in. DMs are always answered.',
  },
  mention_only: {
    type: 'boolean',
    default: false,
    description: 'In channels, answer only messages that @mention the bot. DMs are always answered.',
  },
}

const connectorSchema = {
  type: 'object',
  required: ['type'],
  properties: {type: {enum: ['meepachat', 'discord', 'slack']}},
  allOf: [
    {
      if: {properties: {type: {const: 'meepachat'}}},
      then: {
        additionalProperties: false,
        required: ['url', 'bot_token'],
        properties: {
          type: {},
          url: {type: 'string', pattern: '^wss?://'},
          bot_token: {type: 'string', minLength: 1},
          tls_verify: {
            type: 'boolean',
            default: true,
            description:
              "Verify the server's TLS certificate (wss://, https://). false accepts any certificate: anyone on the path can read and impersonate the server; serve and `config check` warn.",
          },
          ...audienceFields,
        },
      },
    },
    {
      if: {properties: {type: {const: 'discord'}}},
      then: {
        additionalProperties: false,
        required: ['bot_token'],
        properties: {
          type: {},
          bot_token: {type: 'string', minLength: 1},
          guild_ids: stringList,
          api_url: {type: 'string'},
          ...audienceFields,
        },
      },
    },
    {
      if: {properties: {type: {const: 'slack'}}},
      then: {
        additionalProperties: false,
        required: ['bot_token', 'app_token'],
        properties: {
          type: {},
          bot_token: {type: 'string', pattern: '^xoxb-'},
          app_token: {type: 'string', pattern: '^xapp-'},
          api_url: {type: 'string'},
          ...audienceFields,
        },
      },
    },
  ],
}

const agentFields = {
  name: {type: 'string'},
  provider: {type: 'string'},
  model: {type: 'string'},
  max_iterations: {type: 'integer', minimum: 1, maximum: 1000},
  timeout_seconds: {type: 'number', exclusiveMinimum: 0},
  container_mode: containerModeSchema,
  file_access: fileAccessSchema,
  limits: limitsSchema,
  attachments: attachmentsSchema,
  connectors: {type: 'array', items: connectorSchema},
  secrets: {type: 'array', items: {type: 'string', pattern: '^[A-Za-z_][A-Za-z0-9_]*$'}},
}

export const CONFIG_SCHEMA = {
  $schema: 'http://json-schema.org/draft-07/schema#',
  $id: 'https://meepagateway.dev/config.schema.json',
  title: 'meepagateway config.yaml',
  type: 'object',
  additionalProperties: false,
  required: ['providers', 'agents'],
  properties: {
    providers: {
      type: 'object',
      additionalProperties: false,
      required: ['primary', 'providers'],
      properties: {
        primary: {type: 'string', minLength: 1},
        fallback: stringList,
        providers: {type: 'object', minProperties: 1, additionalProperties: providerSchema},
      },
    },
    captain: {
      type: 'object',
      additionalProperties: false,
      properties: {
        enabled: {type: 'boolean'},
        bind: {type: 'string', minLength: 1},
        port: {type: 'integer', minimum: 0, maximum: 65535},
        // Host header values (name, or name:port) besides loopback ones; others get 421 (DNS rebinding)
        allowed_hosts: {type: 'array', items: {type: 'string', minLength: 1, pattern: '^[A-Za-z0-9.:\\[\\]-]+$'}},
      },
    },
    image_config: {
      type: 'object',
      additionalProperties: false,
      properties: {
        enabled: {type: 'boolean'},
        image: {type: 'string'},
        base_image: {type: 'string', minLength: 1},
        packages: {type: 'array', items: {type: 'string', pattern: '^[a-zA-Z0-9][a-zA-Z0-9.+:=~_-]*$'}},
        env_vars: {
          type: 'object',
          propertyNames: {pattern: '^[A-Za-z_][A-Za-z0-9_]*$'},
          additionalProperties: {type: 'string'},
        },
        inject_credentials_env: {type: 'boolean'},
        inject_secrets_env: {type: 'boolean'},
        redact_secrets: {type: 'boolean'},
      },
    },
    gateway: {
      type: 'object',
      additionalProperties: false,
      properties: {
        max_concurrent_runs: {type: 'integer', minimum: 1},
        queue_limit: {type: 'integer', minimum: 1},
        shutdown_grace_seconds: {type: 'number', minimum: 0},
        max_standbys: {type: 'integer', minimum: 0},
        standby_idle_minutes: {type: 'number', exclusiveMinimum: 0},
        reply_delivery_minutes: {type: 'number', exclusiveMinimum: 0},
        max_queued_chat_files_size: {
          type: 'string',
          pattern: '^[0-9]+[kmg]$',
          description:
            "Bytes of files that web chat messages (POST /api/chat) waiting for their run may hold in the gateway's memory, all agents together; past it a request with files is answered 429 (one alone is taken while no other waits). Released when the run starts.",
        },
        max_outbox_spool_size: {
          type: 'string',
          pattern: '^[0-9]+[kmg]$',
          description:
            "Bytes of the files chat replies carry that the gateway keeps until they are delivered (<home>/spool/outbox), all agents together; a file past it is not sent, and the reply's text says so.",
        },
      },
    },
    engines: {type: 'array', items: engineSchema},
    agent_defaults: {type: 'object', additionalProperties: false, properties: agentFields},
    agents: {
      type: 'array',
      items: {
        type: 'object',
        additionalProperties: false,
        required: ['id'],
        properties: {id: {type: 'string', pattern: AGENT_ID_PATTERN}, ...agentFields},
      },
    },
  },
} as const

/** How the schema is checked: every problem at once, defaults applied by the loader, not by ajv. */
export const CONFIG_AJV_OPTIONS = {allErrors: true, strict: false, useDefaults: false} as const
