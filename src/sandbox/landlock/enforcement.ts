import type {SandboxPolicy} from '../policy.js'
import type {NamespaceProbe} from '../bwrap/namespaces.js'
import type {KernelProbe} from './helper.js'
import {FS_RIGHTS, RIGHT_SINCE_ABI, type FsRight} from './rights.js'

/**
 * What the kernel will enforce of a policy, rule by rule, and what it cannot (the gaps). The helper
 * makes the same decision in C and is the final word; this copy lets the runner refuse with a clear
 * error before spawning anything and lets `sandbox explain` print the manifest.
 */
export interface EnforcementReport {
  platform: 'linux'
  kernel: {landlock_abi: number; landlock_unavailable?: string; seccomp: boolean; arch: string}
  network: {mode: 'allow' | 'deny'; listen: 'allow' | 'deny'; enforced_by: string[]}
  namespaces: {
    available: boolean
    tool?: string
    unavailable?: string
    covered: Array<{path: string; kind: 'dir' | 'file'; reason: string; mechanism: string}>
  }
  rules: Array<{path: string; rights: FsRight[]; reason: string; mechanism: string}>
  denies: Array<{path: string; reason: string; source: 'config' | 'mandatory'; exists: boolean; mechanism: string}>
  process: Array<{what: string; mechanism: string}>
  limits: string[]
  gaps: string[]
  best_effort: boolean
  enforced: boolean
  notes: string[]
}

export function kernelGaps(
  probe: KernelProbe,
  network: 'allow' | 'deny',
  listen: 'allow' | 'deny' = 'allow',
): string[] {
  const gaps: string[] = []
  const abi = probe.landlock.abi
  if (abi < 1)
    gaps.push(
      `file rules: Landlock is unavailable (${probe.landlock.errno ?? '?'}: ${probe.landlock.reason ?? 'unknown reason'})`,
    )
  else {
    if (abi < 3) gaps.push('truncate(2) of readable files (needs Landlock ABI 3, Linux 6.2)')
    if (abi < 5) gaps.push('ioctl on device files (needs Landlock ABI 5, Linux 6.10)')
    if (abi < 6) gaps.push('signals to processes outside the sandbox (needs Landlock ABI 6, Linux 6.12)')
  }
  if (!probe.seccomp) {
    gaps.push(
      'seccomp filter unavailable: unix sockets (the Docker socket), io_uring, leaving the process group, new user namespaces and set-user-ID bits are not blocked',
    )
    if (network === 'deny') gaps.push('network off: UDP, raw and packet sockets are not blocked (no seccomp)')
    if (network === 'deny' && abi < 4) gaps.push('network off: TCP is not blocked (no seccomp and Landlock ABI < 4)')
    if (listen === 'deny' && network === 'allow') {
      gaps.push(
        abi < 4
          ? 'listening off: binding and listening on TCP and UDP ports are not blocked (no seccomp and Landlock ABI < 4)'
          : 'listening off: UDP binds and listen() on an unbound TCP socket are not blocked (no seccomp)',
      )
    }
  }
  return gaps
}

/**
 * What the sandbox loses without the namespace layer, each a gap (acceptable only with
 * best_effort): the read-only mount of everything outside the writable grants, the one thing
 * that refuses chmod, chown, utimes, xattrs and attribute flags there (Landlock has no right for
 * them); and a deny inside a writable tree costs its parents their create, rename and delete
 * rights. With the layer, only denies it cannot cover (missing entries, symlinks) still lower a
 * directory: by design, not a gap.
 */
export function namespaceGaps(
  policy: Pick<SandboxPolicy, 'lowered'>,
  namespaces: NamespaceProbe | undefined,
): string[] {
  if (!namespaces || namespaces.available) return []
  return [
    `file metadata outside the writable grants (chmod, chown, times, extended attributes, attribute flags) is not protected: Landlock has no right for it, and the read-only mount that refuses it needs the namespace layer, which is unavailable: ${namespaces.reason ?? 'not probed'}`,
    ...loweringWarnings(policy, namespaces),
  ]
}

/** Every writable directory that a deny beneath it leaves listing-only, and why, for `config check` and the run log. */
export function loweringWarnings(
  policy: Pick<SandboxPolicy, 'lowered'>,
  namespaces: NamespaceProbe | undefined,
): string[] {
  return policy.lowered
    .filter((dir) => dir.writable)
    .map((dir) => {
      const denied = `${dir.path} loses create, rename and delete rights (listing only) because ${dir.denied.join(', ')} ${dir.denied.length === 1 ? 'is' : 'are'} denied beneath it`
      return namespaces?.available
        ? `${denied}: a missing or symlinked entry cannot be covered (create it as a real file or directory)`
        : `${denied} and the namespace layer that would cover ${dir.denied.length === 1 ? 'it' : 'them'} is unavailable: ${namespaces?.reason ?? 'not probed'}`
    })
}

export function enforcementReport(
  policy: SandboxPolicy,
  probe: KernelProbe,
  namespaces?: NamespaceProbe,
): EnforcementReport {
  const abi = probe.landlock.abi
  const gaps = [...kernelGaps(probe, policy.network, policy.listen), ...namespaceGaps(policy, namespaces)]
  const inNamespaces = namespaces?.available === true
  const landlock = abi >= 1
  const unsupported = (rights: readonly FsRight[]) => rights.filter((right) => RIGHT_SINCE_ABI[right] > abi)
  const handledCount = FS_RIGHTS.filter((right) => RIGHT_SINCE_ABI[right] <= abi).length

  const rules = policy.rules.map((rule) => {
    const missing = unsupported(rule.rights)
    const mechanism = !landlock
      ? 'nothing (Landlock unavailable)'
      : `Landlock path rule (ABI ${abi} handles ${handledCount} of ${FS_RIGHTS.length} file rights${missing.length ? `; ${missing.join(', ')} not known to this kernel` : ''})`
    return {path: rule.path, rights: rule.rights, reason: rule.reason, mechanism}
  })

  const denies = policy.denies.map((deny) => {
    const socket = deny.reason === 'the container engine socket'
    const cover = policy.covered.find((entry) => entry.path === deny.path)
    let mechanism = cover
      ? `covered in the mount namespace by ${cover.kind === 'dir' ? 'an empty read-only mode-000 tmpfs' : 'an empty read-only mode-000 file'} (bubblewrap); its parent keeps its full grant`
      : landlock
        ? 'Landlock: no rule reaches it (denied by omission)'
        : 'nothing (Landlock unavailable)'
    if (socket) {
      mechanism += probe.seccomp
        ? '; seccomp: socket(AF_UNIX) is denied, because Landlock before ABI 9 cannot restrict connect() to a socket path'
        : '; connect() to it is NOT blocked (no seccomp)'
    }
    return {...deny, mechanism}
  })

  // agent-run's LLM calls go over stdin/stdout to the gateway, which makes them: the mode is the whole tree's.
  const networkMechanisms: string[] = [
    'applies to agent-run and everything it starts; LLM calls go to the gateway over stdin/stdout and the gateway calls the provider',
  ]
  if (policy.network === 'deny') {
    if (abi >= 4) networkMechanisms.push('Landlock: TCP bind and connect handled, no port allowed')
    if (probe.seccomp)
      networkMechanisms.push(
        'seccomp: socket() denied for every address family (UDP, raw, packet, netlink included); socketpair(AF_UNIX) allowed',
      )
  } else
    networkMechanisms.push(
      'not restricted (allow_network: true); only socket(AF_UNIX) and AF_VSOCK are denied by seccomp',
    )
  if (policy.network === 'allow' && policy.listen === 'deny') {
    if (abi >= 4)
      networkMechanisms.push('no listening (allow_listen: false): Landlock handles TCP bind with no port allowed')
    if (probe.seccomp)
      networkMechanisms.push(
        'no listening: seccomp denies listen() and every AF_INET/AF_INET6 bind (TCP and UDP, port 0 included); outgoing connections still work',
      )
  } else if (policy.listen === 'allow')
    networkMechanisms.push(
      'listening allowed (allow_listen: true): commands may bind ports on every interface the host has',
    )

  const processRules = [
    {
      what: 'environment',
      mechanism:
        "replaced by an explicit allow-list (PATH, HOME=workspace, TMPDIR, LANG); the agent's own secrets reach agent-run on stdin only",
    },
    {
      what: 'provider API keys',
      mechanism: 'never inside: they stay in the gateway, which makes every LLM call for agent-run (docs/agent-run.md)',
    },
    {
      what: 'privileges',
      mechanism: 'no_new_privs set; all capabilities and the bounding set dropped (root inside is an ordinary uid 0)',
    },
    {what: 'inherited file descriptors', mechanism: 'everything above 2 closed before exec'},
    {
      what: 'process tree',
      mechanism: inNamespaces
        ? 'a PID namespace whose init is bubblewrap, under the keeper: the keeper kills the run (its session, its cgroup, every descendant) when agent-run exits, at the deadline and when the gateway dies, and the kernel then kills every process left in the namespace; setsid is denied too'
        : probe.seccomp
          ? 'new session under the keeper; setsid denied by seccomp, so every descendant stays in it, and the keeper kills the session, the run cgroup and every descendant when agent-run exits, at the deadline and when the gateway dies (setpgid stays allowed: each shell command gets its own group for the tool timeout)'
          : 'new session; descendants CAN leave it (no seccomp)',
    },
    {
      what: 'signals and abstract unix sockets',
      mechanism:
        abi >= 6
          ? 'Landlock scoping (ABI 6): nothing outside the sandbox can be signalled or reached'
          : 'NOT scoped (Landlock ABI < 6)',
    },
    {
      what: 'file metadata outside the writable grants (chmod, chown, times, extended attributes, attribute flags)',
      mechanism: inNamespaces
        ? "refused (read-only file system): the host's / is bound read-only and only the read-write grants are bound writable over it; the host device nodes in the private /dev are read-only mounts too"
        : `NOT protected: Landlock has no right for it and the read-only mount needs the namespace layer (${namespaces?.reason ?? 'not used'})`,
    },
    {
      what: 'set-user-ID, set-group-ID and file capabilities',
      mechanism: [
        probe.seccomp
          ? 'seccomp refuses every mode with S_ISUID or S_ISGID (chmod, fchmod, fchmodat, fchmodat2, creat, mknod, open and openat with O_CREAT; openat2 answers ENOSYS)'
          : 'setting the bits is NOT blocked (no seccomp)',
        inNamespaces ? 'the workspace, TMPDIR and every grant are mounted nosuid,nodev' : '',
        'no capabilities, so no file capability can be set',
      ]
        .filter(Boolean)
        .join('; '),
    },
    {
      what: 'new user namespaces',
      mechanism: probe.seccomp
        ? 'denied by seccomp (clone and unshare with CLONE_NEWUSER; clone3 answers ENOSYS)'
        : 'NOT blocked (no seccomp)',
    },
    {what: 'io_uring, TIOCSTI', mechanism: probe.seccomp ? 'denied by seccomp' : 'NOT blocked (no seccomp)'},
    {
      what: 'mount and unmount (the covers stay in place)',
      mechanism: [landlock ? 'denied by Landlock' : '', probe.seccomp ? 'denied by seccomp' : '', 'no capabilities']
        .filter(Boolean)
        .join('; '),
    },
    {
      what: 'other processes',
      mechanism: inNamespaces
        ? "PID namespace with its own /proc (bubblewrap): only the run's own processes are visible; when its init dies the kernel kills all of them"
        : `VISIBLE: no PID namespace (${namespaces?.reason ?? 'namespace layer not used'}), every host process and its command line can be listed`,
    },
    {
      what: 'pseudo-terminals',
      mechanism: inNamespaces
        ? 'a private devpts instance: openpty and script work, no host terminal is reachable'
        : "unavailable: /dev/ptmx is denied (the host's /dev/pts would expose other terminals)",
    },
  ]

  const limits = [
    ...(inNamespaces && policy.covered.length > 0
      ? [
          "a covered path still shows in its parent's listing (as an empty, unreadable entry) and its mount is visible in /proc/self/mountinfo",
        ]
      : []),
    ...policy.lowered.map(
      (dir) =>
        `${dir.path}: listing only, because ${dir.denied.join(', ')} ${dir.denied.length === 1 ? 'is' : 'are'} denied beneath it: names inside it stay visible to directory listings, and no entry can be created, renamed or removed directly in it (its other entries keep their own grants)`,
    ),
    'metadata (existence, size, times via stat) of denied paths is not hidden: Landlock does not control stat',
    'the rules are a snapshot taken when the run starts: an entry created later in a listing-only directory gets no access',
    'unix sockets: socket(AF_UNIX) is denied entirely (socketpair works), so programs that talk to local daemons fail',
    '/tmp itself is not granted: programs must honour TMPDIR (the private temp dir)',
  ]

  return {
    platform: 'linux',
    kernel: {
      landlock_abi: abi,
      ...(abi < 1 ? {landlock_unavailable: probe.landlock.reason ?? 'unknown'} : {}),
      seccomp: probe.seccomp,
      arch: probe.arch,
    },
    network: {mode: policy.network, listen: policy.listen, enforced_by: networkMechanisms},
    namespaces: {
      available: inNamespaces,
      ...(inNamespaces ? {tool: namespaces!.bwrap} : {unavailable: namespaces?.reason ?? 'not probed'}),
      covered: policy.covered.map((cover) => ({
        ...cover,
        mechanism: cover.kind === 'dir' ? 'empty read-only tmpfs, mode 000' : 'empty read-only file, mode 000',
      })),
    },
    rules,
    denies,
    process: processRules,
    limits,
    gaps,
    best_effort: policy.bestEffort,
    enforced: gaps.length === 0,
    notes: policy.notes,
  }
}
