import YAML from 'yaml'
import {resolveAgent} from '../config/load.js'
import type {GatewayConfig} from '../config/types.js'
import {agentWeakenings, imageConfigWeakenings} from './weakenings.js'
import type {AuditLog} from '../state/audit.js'

/** Fields whose written value changed, as `field: old → new` (JSON), and the same as data. */
export function writtenChanges(
  before: Record<string, unknown>,
  after: Record<string, unknown>,
): Array<{field: string; old: unknown; new: unknown}> {
  const fields = [...new Set([...Object.keys(before), ...Object.keys(after)])].filter((field) => field !== 'connectors')
  return fields
    .filter((field) => JSON.stringify(before[field]) !== JSON.stringify(after[field]))
    .map((field) => ({
      field,
      old: withoutValues(field, before[field] ?? null),
      new: withoutValues(field, after[field] ?? null),
    }))
}

/** env_vars may hold tokens baked into an image: the record names the variables, not their values. */
function withoutValues(field: string, value: unknown): unknown {
  if (field !== 'env_vars' || !value || typeof value !== 'object') return value
  return Object.fromEntries(Object.entries(value).map(([name, text]) => [name, `(${String(text).length} characters)`]))
}

/** One audit entry per API config change; a warning when it weakens isolation or redaction. */
export function auditConfigChange(
  audit: AuditLog,
  entry: {
    what: string
    principal: string
    source: string
    before: Record<string, unknown>
    after: Record<string, unknown>
    weakenings: string[]
  },
): void {
  const changes = writtenChanges(entry.before, entry.after)
  if (changes.length === 0) return
  const described = changes
    .map((change) => `${change.field}: ${JSON.stringify(change.old)} → ${JSON.stringify(change.new)}`)
    .join('; ')
  audit.record({
    event: 'config_change',
    level: entry.weakenings.length > 0 ? 'warning' : 'info',
    principal: entry.principal,
    source: entry.source,
    summary: `${entry.what} changed: ${described}${entry.weakenings.length > 0 ? ` (WEAKENS ISOLATION: ${entry.weakenings.join('; ')})` : ''}`,
    details: {target: entry.what, changes, weakenings: entry.weakenings},
  })
}

/**
 * A hand edit of config.yaml, audited as the dashboard audits its own: one entry per agent whose
 * entry changed and per other section that changed, at WARNING when it weakens isolation or
 * redaction. An agent weakened by agent_defaults alone is named in that section's entry.
 */
export function auditFileEdit(
  audit: AuditLog,
  before: {text: string; config: GatewayConfig},
  after: {text: string; config: GatewayConfig},
): void {
  const rawBefore = writtenSections(before.text)
  const rawAfter = writtenSections(after.text)
  const record = (what: string, writtenBefore: unknown, writtenAfter: unknown, weakenings: string[]) =>
    auditConfigChange(audit, {
      what,
      principal: 'hand edit',
      source: 'file',
      before: asSection(writtenBefore),
      after: asSection(writtenAfter),
      weakenings,
    })
  const entriesBefore = writtenAgents(rawBefore.agents)
  const entriesAfter = writtenAgents(rawAfter.agents)
  const byDefaults: string[] = []
  for (const id of new Set([...entriesBefore.keys(), ...entriesAfter.keys()])) {
    const agentBefore = before.config.agents.find((agent) => agent.id === id) ?? resolveAgent({id}, {})
    const agentAfter = after.config.agents.find((agent) => agent.id === id)
    const weakenings = agentAfter ? agentWeakenings(agentBefore, agentAfter) : []
    if (JSON.stringify(entriesBefore.get(id)) !== JSON.stringify(entriesAfter.get(id)))
      record(`agent ${id}`, entriesBefore.get(id), entriesAfter.get(id), weakenings)
    else byDefaults.push(...weakenings.map((weakening) => `agent ${id}: ${weakening}`))
  }
  for (const section of new Set([...Object.keys(rawBefore), ...Object.keys(rawAfter)])) {
    if (section === 'agents') continue
    const weakenings =
      section === 'agent_defaults'
        ? byDefaults
        : section === 'image_config'
          ? imageConfigWeakenings(before.config.image_config, after.config.image_config)
          : []
    record(section, rawBefore[section], rawAfter[section], weakenings)
  }
}

function writtenSections(text: string): Record<string, unknown> {
  const parsed = YAML.parse(text) as unknown
  return asSection(parsed)
}

function asSection(value: unknown): Record<string, unknown> {
  return value && typeof value === 'object' && !Array.isArray(value) ? (value as Record<string, unknown>) : {}
}

/** Agents' entries as written, by id (the file was validated: ids are present and unique). */
function writtenAgents(agents: unknown): Map<string, Record<string, unknown>> {
  const entries = Array.isArray(agents) ? agents.map(asSection) : []
  return new Map(entries.map((entry) => [String(entry.id), entry]))
}
