import type {ProviderConfig, ProviderKind, ProvidersConfig} from '../config/types.js'
import {GatewayError} from '../util/errors.js'
import {ProviderFailure} from './failure.js'
import {type AttemptRecord, chatWithRetries, type RetryOptions, retryOptions} from './retry.js'
import type {ChatProvider, ChatRequest, ChatResponse} from '../shapes/provider-types.js'

export type {AttemptRecord} from './retry.js'
export type {
  ChatMessage,
  ChatProvider,
  ChatRequest,
  ChatResponse,
  ToolCall,
  ToolDefinition,
} from '../shapes/provider-types.js'

/** The agent loop's one door to the LLMs: the primary, then each fallback in order. */
export interface ProviderChain {
  /** Provider names in the order they are tried. */
  readonly order: string[]
  chat(request: ChatRequest): Promise<ChatResponse>
  /** Loads what the first chat() needs, so it overlaps the caller's wait (a runner: agent-run starting). */
  warm(): void
}

type ProviderFactory = (name: string, config: ProviderConfig, apiKey: string) => ChatProvider

/**
 * SDKs load on first use: importing @anthropic-ai/sdk costs ~150 ms and openai ~70 ms, which a
 * `send` (and agent-run run by hand) would pay for kinds it never calls.
 */
const FACTORY_LOADERS: Record<ProviderKind, () => Promise<ProviderFactory>> = {
  anthropic: async () => (await import('./anthropic.js')).createAnthropicProvider,
  openai: async () => (await import('./openai.js')).createOpenAiProvider,
}

/** Sent when a provider has no api_key_env: local servers (Ollama...) ignore it, but the SDKs require one. */
const PLACEHOLDER_API_KEY = 'no-key-configured'

/**
 * Builds the chain for one agent. `override` is the agent's `provider`/`model`: the provider
 * replaces `providers.primary`, the model applies to that first provider only (a model name means
 * nothing to another vendor). Unknown provider names are a config error, raised here at once.
 */
export function createProviderChain(
  providers: ProvidersConfig,
  secrets: Record<string, string>,
  override: {provider?: string; model?: string} = {},
  options: Partial<RetryOptions> = {},
): ProviderChain {
  const primary = override.provider || providers.primary
  requireDefined(providers, primary, override.provider ? 'agent provider' : 'providers.primary')
  for (const [index, name] of (providers.fallback ?? []).entries())
    requireDefined(providers, name, `providers.fallback[${index}]`)

  const order = [...new Set([primary, ...(providers.fallback ?? [])])]
  const configs = new Map(order.map((name) => [name, providers.providers[name]]))
  if (override.model) configs.set(primary, {...providers.providers[primary], model: override.model})
  for (const [name, config] of configs) {
    if (!(config.kind in FACTORY_LOADERS)) {
      throw new GatewayError('E_CONFIG', `providers.providers.${name}.kind: unknown kind "${config.kind}"`, {
        suggestions: [`Use kind: anthropic or kind: openai (any OpenAI-compatible server, with base_url)`],
      })
    }
  }

  const retry = retryOptions(options)
  const instances = new Map<string, Promise<ChatProvider>>()
  const instance = (name: string, config: ProviderConfig, apiKey: string): Promise<ChatProvider> => {
    let provider = instances.get(name)
    if (!provider) {
      provider = FACTORY_LOADERS[config.kind]().then((create) => create(name, config, apiKey))
      instances.set(name, provider)
    }
    return provider
  }
  return {
    order,
    warm() {
      const config = configs.get(primary)!
      const apiKey = apiKeyFor(primary, config, secrets)
      // with a key, the client is built and its first connection opened (no request is sent)
      const client =
        apiKey instanceof MissingApiKey
          ? FACTORY_LOADERS[config.kind]()
          : instance(primary, config, apiKey).then((provider) => provider.preconnect?.())
      // Node loads undici (≈ 15 ms) on the first use of the fetch classes, which the SDKs build every request with.
      client.then(
        () => new Headers(),
        () => {},
      )
    },
    async chat(request: ChatRequest): Promise<ChatResponse> {
      const attempts: AttemptRecord[] = []
      const failures: ProviderFailure[] = []
      for (const name of order) {
        const config = configs.get(name)!
        const apiKey = apiKeyFor(name, config, secrets)
        if (apiKey instanceof MissingApiKey) {
          attempts.push({provider: name, status: null, message: apiKey.message})
          failures.push(apiKey)
          continue
        }
        try {
          return await chatWithRetries(await instance(name, config, apiKey), request, retry, attempts)
        } catch (error) {
          if (!(error instanceof ProviderFailure)) throw error
          failures.push(error)
        }
      }
      throw chainFailure(failures, attempts, configs)
    },
  }
}

function requireDefined(providers: ProvidersConfig, name: string, where: string): void {
  if (providers.providers[name]) return
  const defined = Object.keys(providers.providers)
  throw new GatewayError('E_CONFIG', `${where}: provider "${name}" is not defined under providers.providers`, {
    suggestions: [
      defined.length > 0 ? `Use one of: ${defined.join(', ')}` : 'Define a provider under providers.providers',
    ],
  })
}

/** A provider skipped because its key was not given: nothing was sent, so it is a configuration problem. */
class MissingApiKey extends ProviderFailure {
  constructor(
    provider: string,
    readonly envVar: string,
  ) {
    super(provider, `no API key: the environment variable ${envVar} is not set`, {retryable: false})
  }
}

function apiKeyFor(name: string, config: ProviderConfig, secrets: Record<string, string>): string | MissingApiKey {
  if (!config.api_key_env) return PLACEHOLDER_API_KEY
  return secrets[config.api_key_env] || new MissingApiKey(name, config.api_key_env)
}

/** One error that says, per provider tried, how many attempts it got and why the last one failed. */
function chainFailure(
  failures: ProviderFailure[],
  attempts: AttemptRecord[],
  configs: Map<string, ProviderConfig>,
): GatewayError {
  const why = (failure: ProviderFailure) => {
    const count = attempts.filter((attempt) => attempt.provider === failure.provider).length
    return `${failure.message} (${count} ${count === 1 ? 'attempt' : 'attempts'})`
  }
  const message =
    failures.length === 1
      ? `LLM provider ${failures[0].provider} failed: ${why(failures[0])}`
      : `All ${failures.length} LLM providers failed: ${failures.map((failure) => `${failure.provider}: ${why(failure)}`).join('; ')}`
  const onlyMissingKeys = failures.every((failure) => failure instanceof MissingApiKey)
  return new GatewayError(onlyMissingKeys ? 'E_CONFIG' : 'E_PROVIDER', message, {
    retryable: failures.at(-1)?.retryable ?? false,
    suggestions: [...new Set(failures.flatMap((failure) => suggestionsFor(failure, configs.get(failure.provider)!)))],
    details: {attempts},
  })
}

function suggestionsFor(failure: ProviderFailure, config: ProviderConfig): string[] {
  const where = `providers.providers.${failure.provider}`
  if (failure instanceof MissingApiKey) {
    return [`Set ${failure.envVar} in the environment of the gateway (named by ${where}.api_key_env)`]
  }
  switch (failure.status) {
    case null:
      return [`Check that ${config.base_url || 'the provider'} is reachable from this machine (${where}.base_url)`]
    case 401:
    case 403:
      return [`Check the API key in ${config.api_key_env ?? `${where}.api_key_env`}`]
    case 404:
      return [`Check ${where}.model ("${config.model}") and ${where}.base_url`]
    case 429:
      return ['The provider is rate limiting: try again later, or add a fallback provider under providers.fallback']
    default:
      return failure.status >= 500
        ? ['The provider is failing: try again later, or add a fallback provider under providers.fallback']
        : [`The provider rejected the request: check ${where}.model and max_tokens`]
  }
}
