import fs from 'node:fs'
import path from 'node:path'
import type {FileAccessConfig} from '../runtime/config/types.js'
import {GatewayError} from '../runtime/util/errors.js'
import {localeOrder} from '../runtime/util/locale-order.js'
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
} from './landlock/rights.js'
import {
  canonicalEntry,
  canonicalPath,
  direntKind,
  entryKind,
  type EntryKind,
  expandConfigPath,
  isStrictlyWithin,
  isWithin,
  stringAncestors,
  withPathMemo,
} from './paths.js'

/**
 * The host-sandbox policy compiler (docs/isolation.md). One policy, computed here in TypeScript, feeds
 * both backends: explicit Landlock `(path, rights)` rules for the Linux helper and the grant/deny
 * lists the Seatbelt profile is written from.
 *
 * Semantics, for any path p:
 *   1. a `deny` from the config covering p -> nothing;
 *   2. a mandatory deny covering p -> nothing, unless a runtime grant (workspace, temp dir,
 *      the app, Node) lies beneath that deny and covers p (the workspace lives in
 *      MEEPAGATEWAY_HOME, which is otherwise denied);
 *   3. a read-write grant covering p -> read-write;
 *   4. a read grant covering p -> read (and execute);
 *   5. otherwise nothing. Writes are never allowed without a read-write grant.
 */

export type AccessClass = 'read' | 'read-write' | 'device-rw' | 'device-read' | 'pty'

export interface PolicyGrant {
  path: string
  access: AccessClass
  reason: string
  /** Runtime grants the agent cannot start without; they survive a mandatory deny above them. */
  pinned: boolean
}

export interface PolicyDeny {
  path: string
  reason: string
  source: 'config' | 'mandatory'
  exists: boolean
}

export interface PolicyRule {
  path: string
  rights: FsRight[]
  reason: string
}

/**
 * A denied entry inside a grant that the namespace layer (bubblewrap) hides: an empty, read-only,
 * mode-000 tmpfs over a directory, an empty mode-000 read-only file over a file. Its parent keeps
 * the grant's full rights instead of being lowered to "listing only".
 */
export interface CoveredPath {
  path: string
  kind: 'dir' | 'file'
  reason: string
}

/** A directory that keeps only its listing because a denied path lies beneath it. */
export interface LoweredDirectory {
  path: string
  denied: string[]
  /** It lies in a read-write grant: lowering it cost create, rename and delete rights. */
  writable: boolean
}

export interface SandboxPolicy {
  rules: PolicyRule[]
  grants: PolicyGrant[]
  denies: PolicyDeny[]
  network: 'allow' | 'deny'
  /** Binding TCP/UDP ports and listen(): 'deny' unless file_access.allow_listen. */
  listen: 'allow' | 'deny'
  bestEffort: boolean
  lowered: LoweredDirectory[]
  /** Denied entries covered inside the mount namespace (empty unless `namespaces`). */
  covered: CoveredPath[]
  /** The policy is meant to run inside bubblewrap's namespaces (private /proc, /dev/pts, covers). */
  namespaces: boolean
  /** Config entries that were skipped or overridden, in words an operator can act on. */
  notes: string[]
}

export type PolicyFileAccess = Pick<
  FileAccessConfig,
  'allow_read' | 'allow_read_write' | 'deny' | 'allow_home_dotfiles' | 'allow_network' | 'best_effort'
> &
  Partial<Pick<FileAccessConfig, 'allow_listen'>>

export interface PolicyInput {
  fileAccess: PolicyFileAccess
  workspace: string
  /** The run's private TMPDIR; it must exist. */
  tmpDir: string
  gatewayHome: string
  configPath?: string
  operatorHome: string
  otherWorkspaces: string[]
  appRoot: string
  nodeBinary: string
  /** Overrides for tests; the defaults describe a real Linux host. */
  systemRead?: readonly string[]
  dnsAndTls?: readonly string[]
  devices?: ReadonlyArray<{path: string; access: 'device-rw' | 'device-read'}>
  etcSecrets?: readonly string[]
  containerSockets?: readonly string[]
  /**
   * Runs inside bubblewrap's user, mount and PID namespaces: denied entries inside a grant are
   * covered instead of lowering their parents, and the private devpts is granted.
   */
  namespaces?: boolean
}

export const SYSTEM_READ = ['/usr', '/bin', '/sbin', '/lib', '/lib32', '/lib64', '/libx32', '/etc', '/proc'] as const

/** macOS (Seatbelt, checked by unit tests only): the OS, /etc, Homebrew's Node and its libraries. */
export const DARWIN_SYSTEM_READ = [
  '/usr',
  '/bin',
  '/sbin',
  '/System',
  '/private/etc',
  '/private/var/db/timezone',
  '/opt/homebrew',
  '/Library/Frameworks',
] as const

/** Added by their resolved targets: an /etc grant does not cover /etc/resolv.conf -> /run/... */
export const DNS_AND_TLS = [
  '/etc/resolv.conf',
  '/etc/hosts',
  '/etc/nsswitch.conf',
  '/etc/gai.conf',
  '/etc/host.conf',
  '/etc/ssl/certs',
  '/etc/ssl/certs/ca-certificates.crt',
  '/etc/ssl/cert.pem',
  '/etc/pki/tls/certs',
  '/etc/ca-certificates',
  '/usr/share/ca-certificates',
] as const

export const DEVICES = [
  {path: '/dev/null', access: 'device-rw'},
  {path: '/dev/zero', access: 'device-rw'},
  {path: '/dev/full', access: 'device-rw'},
  {path: '/dev/random', access: 'device-read'},
  {path: '/dev/urandom', access: 'device-read'},
] as const

/** Files under /etc that hold credentials; /etc/ssh/ssh_host_*_key is added by listing /etc/ssh. */
export const ETC_SECRETS = [
  '/etc/shadow',
  '/etc/master.passwd',
  '/etc/shadow-',
  '/etc/gshadow',
  '/etc/gshadow-',
  '/etc/security/opasswd',
  '/etc/sudoers',
  '/etc/sudoers.d',
  '/etc/ssl/private',
  '/etc/pki/tls/private',
  '/etc/letsencrypt',
  '/etc/NetworkManager/system-connections',
  '/etc/wireguard',
  '/etc/ipsec.secrets',
  '/etc/ppp/chap-secrets',
  '/etc/ppp/pap-secrets',
  '/etc/krb5.keytab',
  '/etc/docker',
  '/etc/credstore',
  '/etc/credstore.encrypted',
] as const

export const CONTAINER_SOCKETS = [
  '/var/run/docker.sock',
  '/run/docker.sock',
  '/run/containerd/containerd.sock',
  '/run/podman/podman.sock',
] as const

/** Landlock has no hard limit, but a policy this large means a deny sits in a huge directory. */
export const MAX_RULES = 4096

const RIGHTS_BY_ACCESS: Record<AccessClass, readonly FsRight[]> = {
  read: READ_RIGHTS,
  'read-write': READ_WRITE_RIGHTS,
  'device-rw': DEVICE_RW_RIGHTS,
  'device-read': DEVICE_READ_RIGHTS,
  pty: PTY_RIGHTS,
}

/**
 * The policy of one run: grants, denies, their lowering or covers, and the Landlock rules (one look
 * at the file system: withPathMemo).
 */
export function compilePolicy(input: PolicyInput): SandboxPolicy {
  return withPathMemo(() => compile(input))
}

function compile(input: PolicyInput): SandboxPolicy {
  const notes: string[] = []
  const workspace = requireDirectory(input.workspace, 'the agent workspace')
  const tmpDir = requireDirectory(input.tmpDir, 'the private temp dir')
  const base = workspace
  const fa = input.fileAccess

  const grants: PolicyGrant[] = []
  const addGrant = (raw: string, access: AccessClass, reason: string, pinned: boolean, quiet: boolean) => {
    const canonical = canonicalPath(raw)
    if (entryKind(canonical) === 'missing') {
      // Never grant a parent in its place: the parent of `.git/index.lock` is all of `.git`.
      if (!quiet) notes.push(`${raw}: does not exist, not granted (its parent is not granted instead)`)
      return
    }
    grants.push({path: canonical, access, reason, pinned})
  }

  for (const dir of input.systemRead ?? (process.platform === 'darwin' ? DARWIN_SYSTEM_READ : SYSTEM_READ))
    addGrant(dir, 'read', 'system directory', false, true)
  for (const file of input.dnsAndTls ?? DNS_AND_TLS) addGrant(file, 'read', 'DNS and TLS configuration', false, true)
  for (const device of input.devices ?? DEVICES) addGrant(device.path, device.access, 'device node', false, true)
  // bubblewrap mounts a devpts instance of the sandbox's own: ptys work, no host terminal is reachable
  if (input.namespaces)
    addGrant('/dev/pts', 'pty', 'the private devpts (pseudo-terminals of the sandbox only)', false, true)
  addGrant(input.appRoot, 'read', 'the installed meepagateway app', true, false)
  addGrant(nodeInstallation(input.nodeBinary), 'read', 'the Node.js runtime', true, false)
  addGrant(workspace, 'read-write', 'the agent workspace', true, false)
  addGrant(tmpDir, 'read-write', 'the private temp dir (TMPDIR)', true, false)
  // A symlink the agent could have planted (in a tree it can write) must not steer a config grant.
  const writable = [
    workspace,
    tmpDir,
    ...fa.allow_read_write.map((raw) => canonicalPath(expandConfigPath(raw, input.operatorHome, base))),
  ]
  const addConfigGrant = (raw: string, field: string, access: AccessClass) => {
    const expanded = expandConfigPath(checkConfigPath(raw, field), input.operatorHome, base)
    const planted = symlinkInWritableTree(expanded, writable)
    if (planted) {
      notes.push(`${field} ${raw}: not granted, it goes through the symlink ${planted}, which the agent can replace`)
      return
    }
    addGrant(expanded, access, `${field.replace(/\[\d+\]$/, '')}: ${raw}`, false, false)
  }
  for (const [index, raw] of fa.allow_read.entries()) addConfigGrant(raw, `allow_read[${index}]`, 'read')
  for (const [index, raw] of fa.allow_read_write.entries())
    addConfigGrant(raw, `allow_read_write[${index}]`, 'read-write')

  const denies: PolicyDeny[] = []
  const deniedPaths = new Set<string>()
  const addDeny = (raw: string, reason: string, source: PolicyDeny['source']) => {
    for (const target of deniedTargets(raw)) {
      if (deniedPaths.has(target)) continue
      deniedPaths.add(target)
      denies.push({path: target, reason, source, exists: entryKind(target) !== 'missing'})
    }
  }
  for (const [index, raw] of fa.deny.entries())
    addDeny(expandConfigDeny(raw, index, input.operatorHome, base), `deny: ${raw}`, 'config')
  addDeny(input.gatewayHome, "MEEPAGATEWAY_HOME: the gateway's config, state and other agents' workspaces", 'mandatory')
  if (input.configPath) addDeny(input.configPath, 'the gateway config file', 'mandatory')
  for (const other of input.otherWorkspaces) addDeny(other, "another agent's workspace", 'mandatory')
  if (!fa.allow_home_dotfiles) {
    for (const dotfile of homeDotfiles(input.operatorHome))
      addDeny(dotfile, "the operator's home dotfiles (allow_home_dotfiles: false)", 'mandatory')
  }
  for (const socket of input.containerSockets ?? CONTAINER_SOCKETS)
    addDeny(socket, 'the container engine socket', 'mandatory')
  for (const secret of input.etcSecrets ?? [...ETC_SECRETS, ...sshHostKeys()])
    addDeny(secret, 'system credentials', 'mandatory')

  const kept = grants.filter((grant) => keepGrant(grant, denies, notes))
  const covered = input.namespaces ? coverableDenies(kept, denies) : []
  const coveredPaths = new Set(covered.map((cover) => cover.path))
  const {rules, lowered} = lowerToRules(
    kept,
    denies.filter((deny) => !coveredPaths.has(deny.path)),
  )
  if (rules.length > MAX_RULES) {
    throw new GatewayError(
      'E_SANDBOX',
      `the sandbox policy needs ${rules.length} Landlock rules (limit ${MAX_RULES})`,
      {
        suggestions: [
          `move the denied paths out of large directories: ${lowered
            .map((dir) => dir.path)
            .slice(0, 5)
            .join(', ')}`,
        ],
      },
    )
  }
  return {
    rules,
    grants: kept,
    denies,
    network: fa.allow_network ? 'allow' : 'deny',
    listen: fa.allow_listen ? 'allow' : 'deny',
    bestEffort: fa.best_effort,
    lowered,
    covered,
    namespaces: input.namespaces === true,
    notes,
  }
}

/** A deny covers what its path resolves to and, when it is a symbolic link, the link itself. */
function deniedTargets(expanded: string): string[] {
  return [canonicalPath(expanded), canonicalEntry(expanded)]
}

function expandConfigDeny(raw: string, index: number, operatorHome: string, workspace: string): string {
  return expandConfigPath(checkConfigPath(raw, `deny[${index}]`), operatorHome, workspace)
}

/**
 * The canonical paths an agent's own `file_access.deny` names (relative ones in its workspace), as
 * the policy denies them: what the gateway must not read on the agent's behalf either.
 */
export function configDeniedPaths(deny: readonly string[], workspace: string, operatorHome: string): string[] {
  if (deny.length === 0) return []
  const base = canonicalPath(workspace)
  return withPathMemo(() =>
    deny.flatMap((raw, index) => deniedTargets(expandConfigDeny(raw, index, operatorHome, base))),
  )
}

/**
 * The denies the mount namespace can hide: existing files and directories (never a symlink: a
 * mount would land on its target) strictly inside a kept grant, with no grant beneath them (a
 * cover over MEEPAGATEWAY_HOME would hide the workspace too). Missing ones stay lowered: a mount
 * point would have to be created on the host.
 */
function coverableDenies(grants: readonly PolicyGrant[], denies: readonly PolicyDeny[]): CoveredPath[] {
  const covered: CoveredPath[] = []
  for (const deny of denies) {
    const kind = entryKind(deny.path)
    if (kind !== 'dir' && kind !== 'file') continue
    if (!grants.some((grant) => isStrictlyWithin(deny.path, grant.path))) continue
    if (grants.some((grant) => isWithin(grant.path, deny.path))) continue
    covered.push({path: deny.path, kind, reason: deny.reason})
  }
  return covered.sort((a, b) => localeOrder(a.path, b.path))
}

/** The rights a path gets from the rules: the union of every rule on it or an ancestor. */
export function effectiveRights(rules: readonly PolicyRule[], target: string): FsRight[] {
  const rights = new Set<FsRight>()
  for (const rule of rules) if (isWithin(target, rule.path)) for (const right of rule.rights) rights.add(right)
  return sortRights(rights)
}

function keepGrant(grant: PolicyGrant, denies: readonly PolicyDeny[], notes: string[]): boolean {
  const covering = denies.filter((deny) => isWithin(grant.path, deny.path))
  const configDeny = covering.find((deny) => deny.source === 'config')
  if (configDeny && grant.pinned) {
    throw new GatewayError(
      'E_CONFIG',
      `file_access ${configDeny.reason} covers ${grant.reason} (${grant.path}); the agent could not run`,
      {
        suggestions: ['deny a path inside the workspace instead, or remove that deny entry'],
      },
    )
  }
  if (configDeny) {
    notes.push(`${grant.reason} (${grant.path}): overridden by ${configDeny.reason}`)
    return false
  }
  const mandatory = covering.find((deny) => deny.source === 'mandatory')
  if (mandatory && !grant.pinned) {
    if (grant.reason !== 'system directory' && grant.reason !== 'DNS and TLS configuration') {
      notes.push(`${grant.reason} (${grant.path}): never granted, it is ${mandatory.reason}`)
    }
    return false
  }
  return true
}

/**
 * Landlock is allow-only and hierarchical: a rule on a directory reaches everything beneath it.
 * A deny inside a grant is therefore lowered: each directory on the way from the grant to the
 * denied entry keeps only its listing, and every sibling off that path gets the grant's rights.
 * Symlinks met on the way get no rule (a rule would land on their target).
 */
export function lowerToRules(
  grants: readonly PolicyGrant[],
  denies: readonly PolicyDeny[],
): {rules: PolicyRule[]; lowered: LoweredDirectory[]} {
  const rules = new Map<string, PolicyRule>()
  const lowered = new Map<string, {denied: Set<string>; writable: boolean}>()
  const emit = (target: string, rights: readonly FsRight[], reason: string, kind: EntryKind = entryKind(target)) => {
    if (kind === 'missing' || kind === 'symlink') return
    const masked = kind === 'dir' ? [...rights] : fileRightsOnly(rights)
    if (masked.length === 0) return
    const existing = rules.get(target)
    if (existing) {
      existing.rights = sortRights([...existing.rights, ...masked])
      if (!existing.reason.split('; ').includes(reason)) existing.reason += `; ${reason}`
    } else rules.set(target, {path: target, rights: sortRights(masked), reason})
  }

  const lower = (
    dir: string,
    rights: readonly FsRight[],
    reason: string,
    inside: readonly PolicyDeny[],
    kind: EntryKind = entryKind(dir),
  ) => {
    if (inside.length === 0) {
      emit(dir, rights, reason, kind)
      return
    }
    if (kind !== 'dir') return
    emit(
      dir,
      rights.filter((right) => ANCESTOR_RIGHTS.includes(right)),
      `${reason} (listing only: a denied path lies beneath)`,
      kind,
    )
    const record = lowered.get(dir) ?? {denied: new Set<string>(), writable: false}
    for (const deny of inside) record.denied.add(deny.path)
    record.writable ||= rights.includes('make_reg')
    lowered.set(dir, record)
    let entries: fs.Dirent[]
    try {
      entries = fs.readdirSync(dir, {withFileTypes: true})
    } catch {
      return // unreadable for the gateway itself: nothing beneath gets a rule
    }
    const {prefix, denied, beneath} = deniesByChild(dir, inside)
    for (const entry of entries.sort((a, b) => (a.name < b.name ? -1 : a.name > b.name ? 1 : 0))) {
      const child = path.join(dir, entry.name)
      if (denied.has(child)) continue
      // an unnormalised `dir` joins to another spelling than the prefix: look at every deny then
      const under =
        child === prefix + entry.name ? beneath.get(child) : inside.filter((deny) => isStrictlyWithin(deny.path, child))
      // the listing's own entry types: no lstat per entry (Node lstats where the file system gives no type)
      if (under && under.length > 0) lower(child, rights, reason, under, direntKind(entry))
      else emit(child, rights, reason, direntKind(entry))
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
      .sort((a, b) => localeOrder(a.path, b.path)),
  }
}

/**
 * The denies strictly within `dir` grouped by the child of `dir` they lie in (by string prefix, as
 * isStrictlyWithin): one pass over the denies instead of one per directory entry.
 */
function deniesByChild(
  dir: string,
  inside: readonly PolicyDeny[],
): {prefix: string; denied: Set<string>; beneath: Map<string, PolicyDeny[]>} {
  const prefix = dir.endsWith(path.sep) ? dir : dir + path.sep
  const denied = new Set<string>()
  const beneath = new Map<string, PolicyDeny[]>()
  for (const deny of inside) {
    denied.add(deny.path)
    if (!deny.path.startsWith(prefix)) continue
    const end = deny.path.indexOf(path.sep, prefix.length)
    if (end === -1) continue // the child itself
    const child = deny.path.slice(0, end)
    const group = beneath.get(child)
    if (group) group.push(deny)
    else beneath.set(child, [deny])
  }
  return {prefix, denied, beneath}
}

/** Drops a rule whose rights its ancestors' rules already give: same effective rights, shorter report. */
function withoutRedundantRules(rules: PolicyRule[]): PolicyRule[] {
  const sorted = rules.sort((a, b) => localeOrder(a.path, b.path))
  const byPath = new Map(sorted.map((rule) => [rule.path, rule]))
  return sorted.filter((rule) => {
    const inherited = new Set<FsRight>()
    for (const ancestor of stringAncestors(rule.path))
      for (const right of byPath.get(ancestor)?.rights ?? []) inherited.add(right)
    return !rule.rights.every((right) => inherited.has(right))
  })
}

/**
 * The Node install to grant: its prefix when it is a private install (nvm, /opt/node), just the
 * binary when it lives in a system directory that is granted anyway.
 */
export function nodeInstallation(nodeBinary: string): string {
  const real = canonicalPath(nodeBinary)
  const binDir = path.dirname(real)
  const prefix = path.dirname(binDir)
  const isPrivatePrefix =
    path.basename(binDir) === 'bin' &&
    !['/', '/usr', '/usr/local'].includes(prefix) &&
    (fs.existsSync(path.join(prefix, 'lib', 'node_modules')) || fs.existsSync(path.join(prefix, 'include', 'node')))
  return isPrivatePrefix ? prefix : real
}

/** The first symlink on the way to `target` that sits inside one of the writable trees, if any. */
function symlinkInWritableTree(target: string, writable: readonly string[]): string | undefined {
  const parts = path.resolve(target).split(path.sep).filter(Boolean)
  let current = '/'
  for (const part of parts) {
    current = path.join(current, part)
    if (entryKind(current) !== 'symlink') continue
    const entry = canonicalEntry(current)
    if (writable.some((root) => isStrictlyWithin(entry, root))) return current
  }
  return undefined
}

function homeDotfiles(operatorHome: string): string[] {
  const home = path.resolve(operatorHome)
  if (home === '/') return []
  try {
    return fs
      .readdirSync(home)
      .filter((name) => name.startsWith('.'))
      .map((name) => path.join(home, name))
  } catch {
    return []
  }
}

function sshHostKeys(): string[] {
  try {
    return fs
      .readdirSync('/etc/ssh')
      .filter((name) => /^ssh_host_.*_key$/.test(name))
      .map((name) => path.join('/etc/ssh', name))
  } catch {
    return []
  }
}

function requireDirectory(dir: string, what: string): string {
  const canonical = canonicalPath(dir)
  if (entryKind(canonical) !== 'dir') {
    throw new GatewayError('E_WORKSPACE', `${what} ${dir} does not exist or is not a directory`, {
      suggestions: ['create the agent with `meepagateway agent create ID`'],
    })
  }
  return canonical
}

/** The helper reads one rule per line: a path with a newline could smuggle in a second rule. */
export function checkConfigPath(raw: string, field: string): string {
  if (typeof raw !== 'string' || raw.trim() === '') {
    throw new GatewayError('E_CONFIG', `file_access.${field}: empty path`, {suggestions: ['remove the empty entry']})
  }
  if (/[\n\r\0]/.test(raw)) {
    throw new GatewayError('E_CONFIG', `file_access.${field}: the path contains a newline or NUL byte`, {
      suggestions: ['rename the file, or leave it out of the policy'],
    })
  }
  return raw
}
