import {printYaml} from './yaml-print.js'
import type {GatewayConfig, LoadedConfig} from './types.js'

export interface ConfigReport {
  path: string
  home: string
  /** The resolved config with every secret value masked. */
  config: GatewayConfig
  yaml: string
  secrets: Array<{name: string; set: boolean}>
}

const MASK = '********'
const SECRET_FIELD = /token|password|secret|api_key$/i

/** Masks values read from the environment and any token-like field, whatever their length. */
function mask(value: unknown, key: string, secretValues: Set<string>): unknown {
  if (typeof value === 'string') return secretValues.has(value) || SECRET_FIELD.test(key) ? MASK : value
  if (Array.isArray(value)) return value.map((item) => mask(item, key, secretValues))
  if (value && typeof value === 'object') {
    return Object.fromEntries(
      Object.entries(value).map(([k, v]) => [k, k === 'env_vars' ? v : mask(v, k, secretValues)]),
    )
  }
  return value
}

/** The resolved config for humans and --json; secret values never leave, only whether each is set. */
export function describeConfig(loaded: LoadedConfig): ConfigReport {
  const masked = mask(loaded.config, '', new Set(Object.values(loaded.secrets))) as GatewayConfig
  const keyNames = Object.values(loaded.config.providers.providers).flatMap((provider) =>
    provider.api_key_env ? [provider.api_key_env] : [],
  )
  const names = [
    ...new Set([
      ...keyNames,
      ...Object.keys(loaded.secrets),
      ...loaded.config.agents.flatMap((agent) => agent.secrets),
    ]),
  ].sort()
  return {
    path: loaded.path,
    home: loaded.home,
    config: masked,
    yaml: printYaml(masked),
    secrets: names.map((name) => ({name, set: name in loaded.secrets})),
  }
}
