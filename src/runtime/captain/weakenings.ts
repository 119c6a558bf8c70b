import type {AgentConfig, EngineConfig, ImageConfig} from '../config/types.js'
import {isolationLevelFor} from '../shapes/isolation-level.js'

/** What a change of one field gives up, in words; undefined when the change gives up nothing. */
type Rule<T> = (before: T, after: T, field: string) => string | undefined

/** A field whose change cannot loosen isolation (the table says why, next to it). */
export const NEUTRAL = 'neutral'
export type FieldAudit<T> = typeof NEUTRAL | Rule<T>

const STRENGTH = {container: 2, 'host-sandbox': 1, unrestricted: 0} as const
const NETWORK_REACH = {none: 0, bridge: 1, host: 2} as const

function valueAt(config: unknown, field: string): unknown {
  return field
    .split('.')
    .reduce<unknown>(
      (value, key) => (value && typeof value === 'object' ? (value as Record<string, unknown>)[key] : undefined),
      config,
    )
}

function shown(value: unknown): string {
  if (value === undefined || value === '') return 'unset'
  return typeof value === 'string' ? value : JSON.stringify(value)
}

/** A number, or a size such as 512m, comparable by magnitude. */
function magnitude(value: unknown): number {
  if (typeof value === 'number') return value
  const match = typeof value === 'string' ? /^([0-9]+)([kmg])$/.exec(value) : null
  return match ? Number(match[1]) * 1024 ** ' kmg'.indexOf(match[2] as string) : Number.NaN
}

/** Entries of a list, or names of a map (env_vars: never its values). */
function entries(value: unknown): string[] {
  if (Array.isArray(value)) return value.map(String)
  return value && typeof value === 'object' ? Object.keys(value) : []
}

const isolationLowered: Rule<AgentConfig> = (before, after) => {
  const [from, to] = [isolationLevelFor(before, false), isolationLevelFor(after, false)]
  return STRENGTH[to] < STRENGTH[from] ? `isolation ${from} → ${to}` : undefined
}

const turnedOn: Rule<unknown> = (before, after, field) =>
  valueAt(after, field) === true && valueAt(before, field) !== true ? `${field} on` : undefined

const turnedOff: Rule<unknown> = (before, after, field) =>
  valueAt(after, field) === false && valueAt(before, field) !== false ? `${field} off` : undefined

const raised: Rule<unknown> = (before, after, field) => {
  const [from, to] = [valueAt(before, field), valueAt(after, field)]
  return magnitude(to) > magnitude(from) ? `${field} raised ${shown(from)} → ${shown(to)}` : undefined
}

/** Set to something else: another image or user (returning to the default one gives up nothing). */
const pointedElsewhere: Rule<unknown> = (before, after, field) => {
  const [from, to] = [valueAt(before, field), valueAt(after, field)]
  return to !== undefined && to !== '' && to !== from ? `${field} ${shown(from)} → ${shown(to)}` : undefined
}

const widened: Rule<unknown> = (before, after, field) => {
  const had = new Set(entries(valueAt(before, field)))
  const added = entries(valueAt(after, field)).filter((entry) => !had.has(entry))
  return added.length > 0 ? `${field} widened by ${added.join(', ')}` : undefined
}

const undenied: Rule<unknown> = (before, after, field) => {
  const still = new Set(entries(valueAt(after, field)))
  const dropped = entries(valueAt(before, field)).filter((entry) => !still.has(entry))
  return dropped.length > 0 ? `${field} no longer denies ${dropped.join(', ')}` : undefined
}

const networkWidened: Rule<unknown> = (before, after, field) => {
  const [from, to] = [valueAt(before, field), valueAt(after, field)] as Array<keyof typeof NETWORK_REACH>
  return NETWORK_REACH[to] > NETWORK_REACH[from] ? `${field} ${from} → ${to}` : undefined
}

/** MeepaChat servers whose certificate an agent's connectors do not verify (tls_verify: false). */
const unverifiedServers = (agent: AgentConfig) =>
  agent.connectors.flatMap((c) => (c.type === 'meepachat' && c.tls_verify === false ? [c.url] : []))

const tlsVerificationOff: Rule<AgentConfig> = (before, after) => {
  const already = new Set(unverifiedServers(before))
  const off = unverifiedServers(after).filter((url) => !already.has(url))
  return off.length > 0 ? `connectors tls_verify off for ${off.join(', ')}` : undefined
}

/**
 * Every field of an agent (as config.yaml's schema has it, nested fields dotted) and what a change
 * of it gives up. A field missing here fails test/runtime/captain/weakenings.test.ts, which walks the schema:
 * a new field cannot land without a decision on whether changing it loosens isolation.
 */
export const AGENT_FIELD_AUDIT: Record<string, FieldAudit<AgentConfig>> = {
  id: NEUTRAL, // which agent; an edit never changes it
  name: NEUTRAL,
  provider: NEUTRAL, // which LLM answers: provider keys stay on the host either way
  model: NEUTRAL,
  max_iterations: NEUTRAL, // LLM turns per message: cost, not what a run reaches
  timeout_seconds: raised,
  'container_mode.enabled': isolationLowered,
  'container_mode.image': pointedElsewhere, // another image may bring setuid tools, another user, anything
  'container_mode.memory_limit': raised,
  'container_mode.timeout_seconds': raised,
  'container_mode.network': networkWidened,
  'container_mode.pids_limit': raised,
  'container_mode.cpus': raised,
  'container_mode.user': pointedElsewhere, // root, or a uid that owns files on the host
  'container_mode.standby': NEUTRAL, // when the next container starts, not what it may do
  'container_mode.engines': widened, // more machines its runs (and its workspace) may go to
  'file_access.unrestricted': isolationLowered,
  'file_access.allow_read': widened,
  'file_access.allow_read_write': widened,
  'file_access.deny': undenied,
  'file_access.allow_home_dotfiles': turnedOn,
  'file_access.allow_network': turnedOn,
  'file_access.allow_listen': turnedOn,
  'file_access.best_effort': turnedOn,
  'limits.memory': raised,
  'limits.pids': raised,
  'limits.cpus': raised,
  'limits.disk': raised,
  // more or bigger files per message: more of the agent's bytes read into the gateway and sent out
  'attachments.max_file_size': raised,
  'attachments.max_files': raised,
  'attachments.max_total_size': raised,
  'attachments.inbox_retention_days': NEUTRAL, // how long received files stay in the workspace, not what runs reach
  connectors: tlsVerificationOff, // who can message the agent is not what its runs reach; an unverified server is
  secrets: widened, // secrets its runs receive
}

/** The same for image_config: what every container agent's image is built from and is given. */
export const IMAGE_CONFIG_FIELD_AUDIT: Record<string, FieldAudit<ImageConfig>> = {
  enabled: turnedOn, // containers then run the image built from base_image, packages and env_vars
  image: pointedElsewhere,
  base_image: pointedElsewhere,
  packages: widened,
  env_vars: widened, // variables (tokens, LD_PRELOAD) every container run starts with
  inject_credentials_env: turnedOn,
  inject_secrets_env: turnedOn,
  redact_secrets: turnedOff,
}

/**
 * The same for each entry of the gateway's `engines:` list (config.yaml only, never the API): an
 * engine reached without TLS, or another host or CA, is another machine the runs trust.
 */
export const ENGINE_FIELD_AUDIT: Record<string, FieldAudit<EngineConfig>> = {
  name: NEUTRAL, // what agents' container_mode.engines call it
  host: pointedElsewhere, // another machine gets the runs and the workspaces
  context: pointedElsewhere,
  kind: NEUTRAL, // docker or podman: the same hardening is asked of both
  max_runs: NEUTRAL, // how many at once, not what each may do
  'tls.ca': pointedElsewhere, // whom the gateway believes to be the engine
  'tls.cert': pointedElsewhere,
  'tls.key': pointedElsewhere,
  insecure: turnedOn, // tcp:// without TLS: anyone on the path owns the engine
  best_effort: turnedOn, // runs without the limits the engine cannot apply
  // whose host keys the gateway believes (host key checking itself cannot be turned off)
  'ssh.known_hosts': pointedElsewhere,
  'ssh.identity': NEUTRAL, // which key the gateway logs in with, not which machine it trusts
}

function weakenings<T>(table: Record<string, FieldAudit<T>>, before: T, after: T): string[] {
  const found = new Set<string>()
  for (const [field, audit] of Object.entries(table)) {
    const given = audit === NEUTRAL ? undefined : audit(before, after, field)
    if (given) found.add(given)
  }
  return [...found]
}

/** What a change of an agent's effective config gives up, in words (empty when nothing). */
export function agentWeakenings(before: AgentConfig, after: AgentConfig): string[] {
  return weakenings(AGENT_FIELD_AUDIT, before, after)
}

export function imageConfigWeakenings(before: ImageConfig, after: ImageConfig): string[] {
  return weakenings(IMAGE_CONFIG_FIELD_AUDIT, before, after)
}

export function engineWeakenings(before: EngineConfig, after: EngineConfig): string[] {
  return weakenings(ENGINE_FIELD_AUDIT, before, after)
}
