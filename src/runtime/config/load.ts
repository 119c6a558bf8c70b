import type {ErrorObject} from 'ajv'
import fs from 'node:fs'
import path from 'node:path'
import YAML from 'yaml'
import {GatewayError} from '../util/errors.js'
import {FROM_SOURCE} from '../util/app-root.js'
import {buildIdentity} from '../util/build-identity.js'
import {homeUnusable, makeHomeDirectories} from '../util/make-directories.js'
import {configDocumentRecord, defaultConfigPath, gatewayHome} from '../util/paths.js'
import {recalled, remember} from '../util/remembered.js'
import {writeWholeFile} from '../util/write-whole-file.js'
import {validateConfigSchema} from './config-validator.js'
import {DEFAULT_AGENT, DEFAULT_CAPTAIN, DEFAULT_CONFIG_YAML, DEFAULT_GATEWAY, DEFAULT_IMAGE_CONFIG} from './defaults.js'
import type {AgentConfig, EngineConfig, GatewayConfig, LoadedConfig} from './types.js'

export interface LoadConfigOptions {
  /** --config: an explicit file, which must exist. */
  configPath?: string
  home?: string
  env?: NodeJS.ProcessEnv
  /** Write the commented default config when the default location has none (commands that need a config). */
  createIfMissing?: boolean
}

/**
 * What a command loads: the config, writing the commented default on first use and telling
 * `notice` so (and which key to set).
 */
export function loadConfigForCommand(configPath: string | undefined, notice: (line: string) => void): LoadedConfig {
  const loaded = loadConfig({configPath, createIfMissing: true})
  if (loaded.created) {
    const primary = loaded.config.providers.providers[loaded.config.providers.primary]
    notice(`Created a default config at ${loaded.path} with one agent, "meepa".`)
    if (primary?.api_key_env && !(primary.api_key_env in loaded.secrets)) {
      notice(`Set ${primary.api_key_env} in your environment to use the ${loaded.config.providers.primary} provider.`)
    }
  }
  return loaded
}

export function loadConfig(options: LoadConfigOptions = {}): LoadedConfig {
  const env = options.env ?? process.env
  const home = options.home ?? gatewayHome(env)
  const configPath = path.resolve(options.configPath ?? defaultConfigPath(home))
  let created = false
  if (!fs.existsSync(configPath)) {
    if (options.configPath !== undefined) {
      throw new GatewayError('E_CONFIG', `config file not found: ${configPath}`, {
        suggestions: ['check the --config path', `or run without --config to use ${defaultConfigPath(home)}`],
      })
    }
    if (!options.createIfMissing) {
      throw new GatewayError('E_CONFIG', `no config at ${configPath}`, {
        suggestions: ['run `meepagateway config check` to create a commented default config'],
      })
    }
    writeDefaultConfig(configPath)
    created = true
  }
  const text = fs.readFileSync(configPath, 'utf8')
  const result = configFromDocument(rememberedDocument(text, configPath, home), configPath, env)
  return {...result, path: configPath, home, created, text}
}

/**
 * parseConfigDocument, remembered for the config's text and this build (its YAML parser): parsing
 * is most of a light command's own work (≈ 3 ms of cold code for a few lines), reading the record
 * 0.1 ms. Only a value JSON carries exactly is remembered.
 */
function rememberedDocument(text: string, source: string, home: string): unknown {
  const record = configDocumentRecord(home)
  // code run from src/ can change between two starts with no build: it trusts only its own records
  const key = `${FROM_SOURCE ? `source:${process.pid}` : buildIdentity()}\n${text}`
  const known = recalled<unknown>(record, key, {maxAgeMs: Number.POSITIVE_INFINITY})
  if (known !== undefined) return known
  const document = parseConfigDocument(text, source)
  if (survivesJson(document)) remember(record, key, document)
  return document
}

/**
 * Strings, booleans, null, finite numbers (not -0), arrays and plain objects of them: what
 * JSON.parse gives back as it was.
 */
function survivesJson(value: unknown): boolean {
  if (value === null || typeof value === 'string' || typeof value === 'boolean') return true
  if (typeof value === 'number') return Number.isFinite(value) && !Object.is(value, -0)
  if (Array.isArray(value)) return value.every((item) => survivesJson(item))
  if (typeof value !== 'object' || Object.getPrototypeOf(value) !== Object.prototype) return false
  return Object.values(value).every((item) => survivesJson(item))
}

/**
 * Writes the default config without ever replacing an operator's file, and without another
 * process reading it half written (several first commands start at once: a cron minute, a CI
 * matrix): written whole, then linked into place.
 */
export function writeDefaultConfig(configPath: string): void {
  const home = path.dirname(configPath)
  makeHomeDirectories(home, home)
  try {
    writeWholeFile(configPath, DEFAULT_CONFIG_YAML, {mode: 0o600, exclusive: true})
  } catch (error) {
    if ((error as NodeJS.ErrnoException).code !== 'EEXIST') throw homeUnusable(home, error)
  }
}

/** Parses and validates config text; every problem is reported at once, each with its path. */
export function parseConfigText(
  text: string,
  source: string,
  env: NodeJS.ProcessEnv = process.env,
): {config: GatewayConfig; secrets: Record<string, string>} {
  return configFromDocument(parseConfigDocument(text, source), source, env)
}

/** The YAML's plain value ({} for an empty file); a syntax error names its line. */
function parseConfigDocument(text: string, source: string): unknown {
  const document = YAML.parseDocument(text, {prettyErrors: true})
  if (document.errors.length > 0) {
    const problems = document.errors.map((error) => error.message.split('\n')[0] ?? error.message)
    throw configError(source, problems)
  }
  return document.toJSON() ?? {}
}

/** The config a parsed document describes: environment substituted, validated, defaults filled in. */
function configFromDocument(
  raw: unknown,
  source: string,
  env: NodeJS.ProcessEnv,
): {config: GatewayConfig; secrets: Record<string, string>} {
  const secrets: Record<string, string> = {}
  const unset = new Map<string, string>()
  const substituted = substituteEnv(raw, '', env, secrets, unset)
  const problems = [...unset].map(([at, name]) => `${at}: environment variable ${name} is not set`)
  if (!validateConfigSchema(substituted)) {
    // a field whose variable is unset is already reported; its "$NAME" placeholder failing a pattern is noise
    problems.push(
      ...formatAjvErrors(validateConfigSchema.errors ?? []).filter(
        (problem) => !unset.has(problem.slice(0, problem.indexOf(': '))),
      ),
    )
  }
  if (problems.length === 0) problems.push(...crossCheck(substituted as RawConfig))
  if (problems.length > 0) throw configError(source, problems)
  const config = resolveConfig(substituted as RawConfig)
  collectProviderSecrets(config, env, secrets)
  return {config, secrets}
}

function configError(source: string, problems: string[]): GatewayError {
  const unique = [...new Set(problems)]
  return new GatewayError(
    'E_CONFIG',
    `invalid config ${source} (${unique.length} problem${unique.length === 1 ? '' : 's'}):\n${unique.map((p) => `  - ${p}`).join('\n')}`,
    {
      suggestions: ['fix the fields named above', 'run `meepagateway config schema` for the full schema'],
      details: {problems: unique},
    },
  )
}

/** `/agents/1/container_mode/memory_limit` becomes `agents[1].container_mode.memory_limit`. */
export function formatInstancePath(instancePath: string): string {
  return instancePath
    .split('/')
    .slice(1)
    .map((part) => part.replaceAll('~1', '/').replaceAll('~0', '~'))
    .reduce((acc, part) => (/^\d+$/.test(part) ? `${acc}[${part}]` : acc ? `${acc}.${part}` : part), '')
}

function formatAjvErrors(errors: ErrorObject[]): string[] {
  // `if/then` wrappers repeat the real error; the branch-specific error already says it.
  return errors
    .filter((error) => error.keyword !== 'if')
    .map((error) => {
      const at = formatInstancePath(error.instancePath) || '(root)'
      switch (error.keyword) {
        case 'additionalProperties':
          return `${at}: unknown field "${String(error.params.additionalProperty)}"`
        case 'required':
          return `${at}: missing required field "${String(error.params.missingProperty)}"`
        case 'enum':
          return `${at}: must be one of ${(error.params.allowedValues as unknown[]).map((v) => JSON.stringify(v)).join(', ')}`
        case 'pattern':
          return `${at}: must match ${String(error.params.pattern)}`
        default:
          return `${at}: ${error.message ?? 'is invalid'}`
      }
    })
}

const ENV_REFERENCE = /^\$(?:\{([A-Za-z_][A-Za-z0-9_]*)\}|([A-Za-z_][A-Za-z0-9_]*))$/

/** Replaces `$NAME` / `${NAME}` values; unset names are collected by the path that used them. */
function substituteEnv(
  value: unknown,
  at: string,
  env: NodeJS.ProcessEnv,
  secrets: Record<string, string>,
  unset: Map<string, string>,
): unknown {
  // baked into an image's layers, readable by anyone who can run it: never a place for the gateway's environment
  if (at === 'image_config.env_vars') return value
  if (typeof value === 'string') {
    const match = ENV_REFERENCE.exec(value)
    if (!match) return value
    const name = (match[1] ?? match[2]) as string
    const resolved = env[name]
    if (resolved === undefined || resolved === '') {
      unset.set(at || '(root)', name)
      return value
    }
    secrets[name] = resolved
    return resolved
  }
  if (Array.isArray(value))
    return value.map((item, index) => substituteEnv(item, `${at}[${index}]`, env, secrets, unset))
  if (value && typeof value === 'object') {
    return Object.fromEntries(
      Object.entries(value).map(([key, item]) => [
        key,
        substituteEnv(item, at ? `${at}.${key}` : key, env, secrets, unset),
      ]),
    )
  }
  return value
}

type RawAgent = Partial<AgentConfig> & {id: string}
interface RawConfig {
  providers: {primary: string; fallback?: string[]; providers: GatewayConfig['providers']['providers']}
  captain?: Partial<GatewayConfig['captain']>
  image_config?: Partial<GatewayConfig['image_config']>
  gateway?: Partial<GatewayConfig['gateway']>
  agent_defaults?: Partial<AgentConfig>
  agents?: RawAgent[]
  engines?: Array<Partial<EngineConfig> & {name: string}>
}

function crossCheck(raw: RawConfig): string[] {
  const problems: string[] = []
  const names = new Set(Object.keys(raw.providers.providers))
  if (!names.has(raw.providers.primary))
    problems.push(`providers.primary: "${raw.providers.primary}" is not defined in providers.providers`)
  for (const [index, name] of (raw.providers.fallback ?? []).entries()) {
    if (!names.has(name)) problems.push(`providers.fallback[${index}]: "${name}" is not defined in providers.providers`)
  }
  if (raw.agent_defaults?.provider && !names.has(raw.agent_defaults.provider)) {
    problems.push(`agent_defaults.provider: "${raw.agent_defaults.provider}" is not defined in providers.providers`)
  }
  const seen = new Map<string, number>()
  for (const [index, agent] of (raw.agents ?? []).entries()) {
    if (agent.provider && !names.has(agent.provider))
      problems.push(`agents[${index}].provider: "${agent.provider}" is not defined in providers.providers`)
    const earlier = seen.get(agent.id)
    if (earlier === undefined) seen.set(agent.id, index)
    else problems.push(`agents[${index}].id: "${agent.id}" is already used by agents[${earlier}]`)
  }
  problems.push(...engineProblems(raw))
  return problems
}

/** What makes the `engines:` list unusable: each problem names the entry and the fix. */
function engineProblems(raw: RawConfig): string[] {
  const problems: string[] = []
  const engines = raw.engines ?? []
  const names = new Set<string>()
  for (const [index, engine] of engines.entries()) {
    const at = `engines[${index}]`
    if (names.has(engine.name)) problems.push(`${at}.name: "${engine.name}" is already used by another engine`)
    names.add(engine.name)
    if ((engine.host === undefined) === (engine.context === undefined))
      problems.push(`${at}: give exactly one of host (unix://, tcp://, ssh://) or context (a docker context name)`)
    const tcp = engine.host?.startsWith('tcp://') ?? false
    if (tcp && !engine.tls && engine.insecure !== true)
      problems.push(
        `${at}.host: ${engine.host} without tls: {ca, cert, key} lets anyone who reaches the port run anything on that machine; add tls (mutual TLS), or set insecure: true to accept that`,
      )
    if (engine.tls && engine.context !== undefined)
      problems.push(
        `${at}.tls: a context brings its own TLS files (docker context create --docker host=…,ca=…,cert=…,key=…)`,
      )
    else if (engine.tls && !tcp) problems.push(`${at}.tls: only a tcp:// host speaks TLS`)
    problems.push(...sshProblems(engine, at))
  }
  const checkAllowed = (list: string[] | undefined, at: string) => {
    for (const name of list ?? [])
      if (!names.has(name))
        problems.push(
          `${at}.container_mode.engines: "${name}" is not in engines:${names.size > 0 ? ` (known: ${[...names].join(', ')})` : ' (the list is empty)'}`,
        )
  }
  checkAllowed(raw.agent_defaults?.container_mode?.engines, 'agent_defaults')
  for (const [index, agent] of (raw.agents ?? []).entries())
    checkAllowed(agent.container_mode?.engines, `agents[${index}]`)
  return problems
}

/** An ssh:// host carries no password (it would sit in argv), and only ssh reads the `ssh:` block. */
function sshProblems(engine: Partial<EngineConfig>, at: string): string[] {
  const ssh = engine.host?.startsWith('ssh://') ?? false
  if (engine.ssh && !ssh && engine.context === undefined)
    return [`${at}.ssh: only an ssh:// host (or a context that names one) is reached over ssh`]
  if (!ssh) return []
  let url: URL
  try {
    url = new URL(engine.host as string)
  } catch {
    return [`${at}.host: ${engine.host} is not a URL; write ssh://user@host or ssh://user@host:port`]
  }
  if (url.password)
    return [
      `${at}.host: a password in an ssh:// URL would be in every ssh command line; remove it and log in with a key (ssh.identity)`,
    ]
  if (!url.hostname) return [`${at}.host: ${engine.host} names no host; write ssh://user@host or ssh://user@host:port`]
  return []
}

/** The engines whose traffic anyone on the network can read and take over (insecure: true). */
export function insecureEngines(config: GatewayConfig): string[] {
  return (config.engines ?? []).filter((engine) => engine.insecure).map((engine) => engine.name)
}

function resolveConfig(raw: RawConfig): GatewayConfig {
  const defaults = raw.agent_defaults ?? {}
  return {
    providers: {
      primary: raw.providers.primary,
      fallback: raw.providers.fallback ?? [],
      providers: raw.providers.providers,
    },
    captain: {...DEFAULT_CAPTAIN, ...raw.captain},
    image_config: {...DEFAULT_IMAGE_CONFIG, ...raw.image_config},
    gateway: {...DEFAULT_GATEWAY, ...raw.gateway},
    agents: (raw.agents ?? []).map((agent) => resolveAgent(agent, defaults)),
    ...(raw.engines && raw.engines.length > 0
      ? {
          engines: raw.engines.map((engine) => ({
            ...engine,
            kind: engine.kind ?? 'docker',
            max_runs: engine.max_runs ?? DEFAULT_ENGINE_MAX_RUNS,
            insecure: engine.insecure ?? false,
            best_effort: engine.best_effort ?? false,
          })),
        }
      : {}),
  }
}

/** Runs at once on an engine whose max_runs is unset. */
export const DEFAULT_ENGINE_MAX_RUNS = 8

/** agent field > agent_defaults > built-in default; nested sections merge field by field. */
export function resolveAgent(agent: RawAgent, defaults: Partial<AgentConfig>): AgentConfig {
  const pick = <K extends keyof AgentConfig>(key: K): AgentConfig[K] | undefined =>
    (agent[key] ?? defaults[key]) as AgentConfig[K] | undefined
  const limits = {...DEFAULT_AGENT.limits, ...defaults.limits, ...agent.limits}
  const resolved: AgentConfig = {
    id: agent.id,
    name: agent.name ?? agent.id,
    max_iterations: pick('max_iterations') ?? DEFAULT_AGENT.max_iterations,
    timeout_seconds: pick('timeout_seconds') ?? DEFAULT_AGENT.timeout_seconds,
    // one `limits` section for every level; container_mode's own limits, when set, still win there
    container_mode: {
      ...DEFAULT_AGENT.container_mode,
      memory_limit: limits.memory,
      pids_limit: limits.pids,
      cpus: limits.cpus,
      ...defaults.container_mode,
      ...agent.container_mode,
    },
    limits,
    file_access: {...DEFAULT_AGENT.file_access, ...defaults.file_access, ...agent.file_access},
    attachments: {...DEFAULT_AGENT.attachments, ...defaults.attachments, ...agent.attachments},
    connectors: (pick('connectors') ?? DEFAULT_AGENT.connectors).map((connector) =>
      connector.type === 'discord' ? {...connector, guild_ids: connector.guild_ids ?? []} : connector,
    ),
    secrets: pick('secrets') ?? DEFAULT_AGENT.secrets,
  }
  const provider = pick('provider')
  const model = pick('model')
  if (provider !== undefined) resolved.provider = provider
  if (model !== undefined) resolved.model = model
  return resolved
}

/**
 * Provider keys and agents' named secrets come from the environment; missing ones are reported when
 * a run needs them.
 */
function collectProviderSecrets(config: GatewayConfig, env: NodeJS.ProcessEnv, secrets: Record<string, string>): void {
  const names = [
    ...Object.values(config.providers.providers).flatMap((provider) =>
      provider.api_key_env ? [provider.api_key_env] : [],
    ),
    ...config.agents.flatMap((agent) => agent.secrets),
  ]
  for (const name of names) {
    const value = env[name]
    if (value) secrets[name] = value
  }
}

export function findAgent(loaded: LoadedConfig, id: string): AgentConfig {
  const agent = loaded.config.agents.find((candidate) => candidate.id === id)
  if (!agent) {
    const known = loaded.config.agents.map((candidate) => candidate.id)
    throw new GatewayError('E_AGENT_UNKNOWN', `unknown agent "${id}" in ${loaded.path}`, {
      suggestions: [
        known.length > 0 ? `known agents: ${known.join(', ')}` : 'the config defines no agents',
        `add it under agents: in ${loaded.path}, then run \`meepagateway agent create ${id}\``,
      ],
    })
  }
  return agent
}
