import fs from 'node:fs'
import path from 'node:path'
import {
  ANCESTOR_RIGHTS,
  DEVICE_READ_RIGHTS,
  DEVICE_RW_RIGHTS,
  type FsRight,
  PTY_RIGHTS,
  READ_RIGHTS,
  READ_WRITE_RIGHTS,
  fileRightsOnly,
  sortRights,
} from '../../src/sandbox/landlock/rights.js'
import type {AccessClass, LoweredDirectory, PolicyDeny, PolicyGrant, PolicyRule} from '../../src/sandbox/policy.js'

// The oracles: lowerToRules, canonicalPath, entryKind and isWithin as they were before they were
// made faster (commit dc0254b), kept verbatim
// so every change to the fast one is compared with it (test/sandbox/lowering-equivalence.test.ts).

const RIGHTS_BY_ACCESS: Record<AccessClass, readonly FsRight[]> = {
  read: READ_RIGHTS,
  'read-write': READ_WRITE_RIGHTS,
  'device-rw': DEVICE_RW_RIGHTS,
  'device-read': DEVICE_READ_RIGHTS,
  pty: PTY_RIGHTS,
}

// the oracle's own path helpers (below), not the fast ones it is compared with
const entryKind = (file: string) => oracleEntryKind(file)
const isStrictlyWithin = (child: string, parent: string) => child !== parent && oracleIsWithin(child, parent)

export function oracleLowerToRules(
  grants: readonly PolicyGrant[],
  denies: readonly PolicyDeny[],
): {rules: PolicyRule[]; lowered: LoweredDirectory[]} {
  const rules = new Map<string, PolicyRule>()
  const lowered = new Map<string, {denied: Set<string>; writable: boolean}>()
  const emit = (target: string, rights: readonly FsRight[], reason: string) => {
    const kind = entryKind(target)
    if (kind === 'missing' || kind === 'symlink') return
    const masked = kind === 'dir' ? [...rights] : fileRightsOnly(rights)
    if (masked.length === 0) return
    const existing = rules.get(target)
    if (existing) {
      existing.rights = sortRights([...existing.rights, ...masked])
      if (!existing.reason.split('; ').includes(reason)) existing.reason += `; ${reason}`
    } else rules.set(target, {path: target, rights: sortRights(masked), reason})
  }

  const lower = (dir: string, rights: readonly FsRight[], reason: string, inside: readonly PolicyDeny[]) => {
    if (inside.length === 0) {
      emit(dir, rights, reason)
      return
    }
    if (entryKind(dir) !== 'dir') return
    emit(
      dir,
      rights.filter((right) => ANCESTOR_RIGHTS.includes(right)),
      `${reason} (listing only: a denied path lies beneath)`,
    )
    const record = lowered.get(dir) ?? {denied: new Set<string>(), writable: false}
    for (const deny of inside) record.denied.add(deny.path)
    record.writable ||= rights.includes('make_reg')
    lowered.set(dir, record)
    let names: string[]
    try {
      names = fs.readdirSync(dir)
    } catch {
      return
    }
    for (const name of names.sort()) {
      const child = path.join(dir, name)
      if (inside.some((deny) => deny.path === child)) continue
      const beneath = inside.filter((deny) => isStrictlyWithin(deny.path, child))
      if (beneath.length > 0) lower(child, rights, reason, beneath)
      else emit(child, rights, reason)
    }
  }

  for (const grant of grants) {
    const inside = denies.filter((deny) => isStrictlyWithin(deny.path, grant.path))
    lower(grant.path, RIGHTS_BY_ACCESS[grant.access], grant.reason, inside)
  }
  return {
    rules: withoutRedundantRules([...rules.values()]),
    lowered: [...lowered.entries()]
      .map(([dir, record]) => ({path: dir, denied: [...record.denied].sort(), writable: record.writable}))
      .sort((a, b) => a.path.localeCompare(b.path)),
  }
}

function withoutRedundantRules(rules: PolicyRule[]): PolicyRule[] {
  const sorted = rules.sort((a, b) => a.path.localeCompare(b.path))
  return sorted.filter((rule) => {
    const inherited = new Set(
      sorted.filter((other) => isStrictlyWithin(rule.path, other.path)).flatMap((other) => other.rights),
    )
    return !rule.rights.every((right) => inherited.has(right))
  })
}

/** canonicalPath, entryKind and isWithin as they were before they avoided exceptions for missing entries. */
export function oracleCanonicalPath(input: string): string {
  const absolute = path.resolve(input)
  let existing = absolute
  const tail: string[] = []
  for (;;) {
    try {
      const real = fs.realpathSync.native(existing)
      return tail.length === 0 ? real : path.join(real, ...tail.reverse())
    } catch {
      const parent = path.dirname(existing)
      if (parent === existing) return absolute
      tail.push(path.basename(existing))
      existing = parent
    }
  }
}

export function oracleEntryKind(file: string): string {
  try {
    const stat = fs.lstatSync(file)
    if (stat.isSymbolicLink()) return 'symlink'
    return stat.isDirectory() ? 'dir' : 'file'
  } catch {
    return 'missing'
  }
}

export function oracleIsWithin(child: string, parent: string): boolean {
  if (child === parent) return true
  const prefix = parent.endsWith(path.sep) ? parent : parent + path.sep
  return child.startsWith(prefix)
}
