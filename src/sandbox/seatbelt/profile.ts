import {isWithin} from '../paths.js'
import type {PolicyDeny, PolicyGrant, SandboxPolicy} from '../policy.js'

/**
 * macOS: the same policy as an SBPL profile for /usr/bin/sandbox-exec. Seatbelt can express a deny
 * inside an allowed tree directly (`require-not`), so the grants and denies are used as compiled,
 * before the Landlock lowering. Paths are never interpolated into the profile: each one is a `-D`
 * parameter, which rules out quoting bugs and injection through odd file names.
 *
 * Checked by unit tests only (there is no macOS machine in CI); see README.
 */

export const SANDBOX_EXEC = '/usr/bin/sandbox-exec'

/** /tmp, /var and /etc are symlinks into /private on macOS, and Seatbelt matches the real path. */
export function darwinCanonical(file: string): string {
  for (const top of ['/tmp', '/var', '/etc']) {
    if (file === top || file.startsWith(`${top}/`)) return `/private${file}`
  }
  return file
}

const BASE = `(version 1)
(deny default)
(allow process-exec)
(allow process-fork)
(allow signal (target same-sandbox))
(allow process-info* (target same-sandbox))
(allow sysctl-read)
(allow file-read-metadata)
(allow ipc-posix-sem)
(allow mach-lookup
  (global-name "com.apple.system.opendirectoryd.libinfo")
  (global-name "com.apple.PowerManagement.control"))
(allow file-ioctl (literal "/dev/null") (literal "/dev/zero") (literal "/dev/random") (literal "/dev/urandom"))`

const NETWORK = `(allow network-outbound)
(allow network-inbound)
(allow system-socket)
(allow mach-lookup
  (global-name "com.apple.SystemConfiguration.DNSConfiguration")
  (global-name "com.apple.SystemConfiguration.configd")
  (global-name "com.apple.trustd.agent")
  (global-name "com.apple.networkd"))`

export interface SeatbeltInvocation {
  argv: string[]
  profile: string
  params: Record<string, string>
}

export function seatbeltProfile(policy: Pick<SandboxPolicy, 'grants' | 'denies' | 'network'>): {
  profile: string
  params: Record<string, string>
} {
  const params: Record<string, string> = {}
  const denyParam = new Map<PolicyDeny, string>()
  policy.denies.forEach((deny, index) => {
    const name = `DENY_${index}`
    params[name] = darwinCanonical(deny.path)
    denyParam.set(deny, name)
  })
  // `literal` and `subpath` both: subpath alone leaves the first creation of the denied path itself open.
  const excluding = (grant: PolicyGrant) =>
    policy.denies
      .filter((deny) => isWithin(deny.path, grant.path) && deny.path !== grant.path)
      .map((deny) => {
        const name = denyParam.get(deny)!
        return `\n    (require-not (literal (param "${name}"))) (require-not (subpath (param "${name}")))`
      })
      .join('')

  const lines = [BASE]
  const section = (access: PolicyGrant['access'], prefix: string, operations: string) => {
    policy.grants
      .filter((grant) => grant.access === access)
      .forEach((grant, index) => {
        const name = `${prefix}_${index}`
        params[name] = darwinCanonical(grant.path)
        lines.push(`(allow ${operations}\n  (require-all (subpath (param "${name}"))${excluding(grant)}))`)
      })
  }
  section('read', 'READ', 'file-read* process-exec')
  section('read-write', 'WRITE', 'file-read* file-write* process-exec')
  section('device-rw', 'DEVICE_RW', 'file-read* file-write-data')
  section('device-read', 'DEVICE_READ', 'file-read*')

  // Move-aside: a denied path and its ancestors cannot be renamed or unlinked to dodge the rule.
  // Grants that live inside a deny (the workspace inside MEEPAGATEWAY_HOME) stay exempt.
  const grantParam = new Map(
    Object.entries(params)
      .filter(([name]) => /^(READ|WRITE|DEVICE_RW|DEVICE_READ)_/.test(name))
      .map(([name, value]) => [value, name]),
  )
  policy.denies.forEach((deny) => {
    const name = denyParam.get(deny)!
    const exempt = policy.grants
      .filter((grant) => grant.path !== deny.path && isWithin(grant.path, deny.path))
      .map(
        (grant) => `
    (require-not (subpath (param "${grantParam.get(darwinCanonical(grant.path))}")))`,
      )
      .join('')
    lines.push(
      exempt
        ? `(deny file-write-unlink
  (require-all (subpath (param "${name}"))${exempt}))`
        : `(deny file-write-unlink (subpath (param "${name}")))`,
    )
  })
  const ancestors = new Set<string>()
  for (const deny of policy.denies) {
    let dir = darwinCanonical(deny.path)
    while (dir !== '/' && dir.includes('/')) {
      dir = dir.slice(0, dir.lastIndexOf('/')) || '/'
      if (dir !== '/') ancestors.add(dir)
    }
  }
  ;[...ancestors].sort().forEach((dir, index) => {
    const name = `DENY_ANCESTOR_${index}`
    params[name] = dir
    lines.push(`(deny file-write-unlink (literal (param "${name}")))`)
  })
  if (policy.network === 'allow') lines.push(NETWORK)
  return {profile: `${lines.join('\n')}\n`, params}
}

/** argv for sandbox-exec, always by absolute path (never looked up on PATH). */
export function seatbeltInvocation(
  policy: Pick<SandboxPolicy, 'grants' | 'denies' | 'network'>,
  command: string[],
): SeatbeltInvocation {
  const {profile, params} = seatbeltProfile(policy)
  const argv = [
    SANDBOX_EXEC,
    '-p',
    profile,
    ...Object.entries(params).flatMap(([name, value]) => ['-D', `${name}=${value}`]),
    ...command,
  ]
  return {argv, profile, params}
}
