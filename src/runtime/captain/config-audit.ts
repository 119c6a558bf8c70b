import type {AuditLog} from '../state/audit.js'

/** Fields whose written value changed, as `field: old → new` (JSON), and the same as data. */
export function writtenChanges(before: Record<string, unknown>, after: Record<string, unknown>): Array<{field: string; old: unknown; new: unknown}> {
  const fields = [...new Set([...Object.keys(before), ...Object.keys(after)])].filter((field) => field !== 'connectors')
  return fields
    .filter((field) => JSON.stringify(before[field]) !== JSON.stringify(after[field]))
    .map((field) => ({field, old: withoutValues(field, before[field] ?? null), new: withoutValues(field, after[field] ?? null)}))
}

/** env_vars may hold tokens baked into an image: the record names the variables, not their values. */
function withoutValues(field: string, value: unknown): unknown {
  if (field !== 'env_vars' || !value || typeof value !== 'object') return value
  return Object.fromEntries(Object.entries(value).map(([name, text]) => [name, `(${String(text).length} characters)`]))
}

/** One audit entry per API config change; a warning when it weakens isolation or redaction. */
export function auditConfigChange(
  audit: AuditLog,
  entry: {what: string; principal: string; source: string; before: Record<string, unknown>; after: Record<string, unknown>; weakenings: string[]},
): void {
  const changes = writtenChanges(entry.before, entry.after)
  if (changes.length === 0) return
  const described = changes.map((change) => `${change.field}: ${JSON.stringify(change.old)} → ${JSON.stringify(change.new)}`).join('; ')
  audit.record({
    event: 'config_change',
    level: entry.weakenings.length > 0 ? 'warning' : 'info',
    principal: entry.principal,
    source: entry.source,
    summary: `${entry.what} changed: ${described}${entry.weakenings.length > 0 ? ` (WEAKENS ISOLATION: ${entry.weakenings.join('; ')})` : ''}`,
    details: {target: entry.what, changes, weakenings: entry.weakenings},
  })
}
