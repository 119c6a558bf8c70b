import {describe, expect, it} from 'vitest'
import type {PolicyDeny, PolicyGrant} from '../../../src/sandbox/policy.js'
import {
  SANDBOX_EXEC,
  darwinCanonical,
  seatbeltInvocation,
  seatbeltProfile,
} from '../../../src/sandbox/seatbelt/profile.js'

// macOS is checked by these tests only: the profile text and the sandbox-exec argv.
const grant = (path: string, access: PolicyGrant['access'], pinned = false): PolicyGrant => ({
  path,
  access,
  reason: 'test',
  pinned,
})
const deny = (path: string, source: PolicyDeny['source'] = 'config'): PolicyDeny => ({
  path,
  reason: 'test',
  source,
  exists: true,
})

const policy = {
  grants: [
    grant('/usr', 'read'),
    grant('/etc', 'read'),
    grant('/Users/op/.meepagateway/agents/a', 'read-write', true),
    grant('/tmp/meepa-run-1', 'read-write', true),
    grant('/dev/null', 'device-rw'),
  ],
  denies: [
    deny('/Users/op/.meepagateway/agents/a/private'),
    deny('/Users/op/.meepagateway', 'mandatory'),
    deny('/etc/master.passwd', 'mandatory'),
  ],
  network: 'deny' as const,
}

describe('Seatbelt profile', () => {
  it('denies by default and passes every path as a -D parameter, never inside the profile text', () => {
    const {profile, params} = seatbeltProfile(policy)
    expect(profile.startsWith('(version 1)\n(deny default)')).toBe(true)
    // only the fixed device nodes of the base profile are literals
    for (const value of Object.values(params).filter((value) => !value.startsWith('/dev/')))
      expect(profile).not.toContain(`"${value}"`)
    expect(profile).not.toContain('/Users/op')
    expect(params.WRITE_0).toBe('/Users/op/.meepagateway/agents/a')
  })

  it('canonicalises /tmp, /var and /etc to /private', () => {
    expect(darwinCanonical('/tmp/x')).toBe('/private/tmp/x')
    expect(darwinCanonical('/var/folders/ab')).toBe('/private/var/folders/ab')
    expect(darwinCanonical('/etc')).toBe('/private/etc')
    expect(darwinCanonical('/private/tmp/x')).toBe('/private/tmp/x')
    expect(darwinCanonical('/tmpfoo')).toBe('/tmpfoo')
    const {params} = seatbeltProfile(policy)
    expect(params.WRITE_1).toBe('/private/tmp/meepa-run-1')
    expect(params.READ_1).toBe('/private/etc')
  })

  it('folds a deny inside a grant into that grant as require-not, for the path itself and beneath it', () => {
    const {profile, params} = seatbeltProfile(policy)
    const privateParam = Object.entries(params).find(
      ([, value]) => value === '/Users/op/.meepagateway/agents/a/private',
    )![0]
    const writeRule = profile.split('\n(allow').find((rule) => rule.includes('(param "WRITE_0")'))!
    expect(writeRule).toContain(`(require-not (literal (param "${privateParam}")))`)
    expect(writeRule).toContain(`(require-not (subpath (param "${privateParam}")))`)
    const passwd = Object.entries(params).find(([, value]) => value === '/private/etc/master.passwd')![0]
    const etcRule = profile.split('\n(allow').find((rule) => rule.includes('(param "READ_1")'))!
    expect(etcRule).toContain(`(require-not (subpath (param "${passwd}")))`)
  })

  it('blocks moving a denied path or its ancestors aside, but not unlinking inside the workspace', () => {
    const {profile, params} = seatbeltProfile(policy)
    const ancestor = Object.entries(params).find(
      ([name, value]) => name.startsWith('DENY_ANCESTOR') && value === '/Users/op/.meepagateway/agents/a',
    )
    expect(ancestor).toBeDefined()
    expect(profile).toContain(`(deny file-write-unlink (literal (param "${ancestor![0]}")))`)
    // the gateway-home deny exempts the workspace beneath it
    const homeParam = Object.entries(params).find(([, value]) => value === '/Users/op/.meepagateway')![0]
    const homeUnlink = profile
      .split('\n(deny')
      .find((rule) => rule.includes(`(subpath (param "${homeParam}"))`) && rule.startsWith(' file-write-unlink'))!
    expect(homeUnlink).toContain('(require-not (subpath (param "WRITE_0")))')
  })

  it('has no network rule with the network off, and outbound/inbound plus DNS and TLS lookups with it on', () => {
    expect(seatbeltProfile(policy).profile).not.toMatch(/network-outbound|system-socket/)
    const open = seatbeltProfile({...policy, network: 'allow'}).profile
    expect(open).toContain('(allow network-outbound)')
    expect(open).toContain('com.apple.SystemConfiguration.DNSConfiguration')
    expect(open).toContain('com.apple.trustd.agent')
  })

  it('runs /usr/bin/sandbox-exec by absolute path with -p, the -D parameters, then the command', () => {
    const {argv, profile, params} = seatbeltInvocation(policy, ['/usr/local/bin/node', 'run.js', 'agent-run'])
    expect(argv[0]).toBe(SANDBOX_EXEC)
    expect(argv[1]).toBe('-p')
    expect(argv[2]).toBe(profile)
    const dashD = argv.slice(3, -3)
    expect(dashD.filter((_, index) => index % 2 === 0).every((flag) => flag === '-D')).toBe(true)
    expect(dashD.filter((_, index) => index % 2 === 1)).toEqual(
      Object.entries(params).map(([name, value]) => `${name}=${value}`),
    )
    expect(argv.slice(-3)).toEqual(['/usr/local/bin/node', 'run.js', 'agent-run'])
  })
})
