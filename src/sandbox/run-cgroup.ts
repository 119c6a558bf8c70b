import fs from 'node:fs'
import path from 'node:path'

/**
 * A cgroup per run (docs/isolation.md, limits): memory, pids and CPU limits for everything a run
 * starts, at the host levels. The sandbox helper's child joins the run's cgroups before anything
 * of the run executes; its keeper kills them when the run ends or its owner dies.
 *
 * - cgroup v2 (unified): where this process may create cgroups with the memory, pids and cpu
 *   controllers (root, or a delegated systemd user slice). The run cgroups live under this
 *   process's own cgroup, in `meepa-runs/`; when that cgroup has processes (v2 forbids
 *   controllers there), the gateway first moves itself into a `meepa-gateway/` leaf beside it.
 * - cgroup v1 (hybrid hosts): one directory per controller hierarchy (memory, pids, cpu, and
 *   freezer to stop a fork bomb while it is killed), under this process's own cgroup of each.
 * - otherwise: no cgroup; `sandbox explain` says the limits are not enforced.
 * Limits are nested under the gateway's own cgroup, so they can only tighten what it has.
 */

export interface RunLimits {
  memoryBytes: number
  pids: number
  cpus: number
}

export type LimitName = 'memory' | 'pids' | 'cpu'

export interface CgroupSupport {
  mode: 'v2' | 'v1' | 'none'
  /** Limits a run cgroup enforces here. */
  enforced: Record<LimitName, boolean>
  /** How (or why not), for `sandbox explain`. */
  how: string
}

const CGROUP_ROOT = '/sys/fs/cgroup'
const RUNS_DIR = 'meepa-runs'
const V1_CONTROLLERS = ['memory', 'pids', 'cpu', 'freezer'] as const
type V1Controller = (typeof V1_CONTROLLERS)[number]

interface Layout {
  support: CgroupSupport
  /** Parent directories of run cgroups: one (v2) or one per v1 controller. */
  parents: Array<{controller: V1Controller | 'unified'; dir: string}>
}

let cached: Layout | undefined

/** This process's cgroup path per hierarchy, from /proc/self/cgroup ('' key: the unified one). */
function ownCgroups(): Map<string, string> {
  const paths = new Map<string, string>()
  let text: string
  try {
    text = fs.readFileSync('/proc/self/cgroup', 'utf8')
  } catch {
    return paths
  }
  for (const line of text.split('\n')) {
    const match = /^\d+:([^:]*):(.*)$/.exec(line)
    if (!match) continue
    const [, controllers, cgroupPath] = match as unknown as [string, string, string]
    if (controllers === '') paths.set('', cgroupPath)
    for (const controller of controllers.split(',')) if (controller) paths.set(controller, cgroupPath)
  }
  return paths
}

function readText(file: string): string | undefined {
  try {
    return fs.readFileSync(file, 'utf8')
  } catch {
    return undefined
  }
}

/** Can this process make a child cgroup in `dir`? (Tried for real: permissions do not tell.) */
function canCreateIn(dir: string): boolean {
  const probe = path.join(dir, `probe-${process.pid}-${Date.now()}`)
  try {
    fs.mkdirSync(dir, {recursive: true})
    fs.mkdirSync(probe)
    fs.rmdirSync(probe)
    return true
  } catch {
    return false
  }
}

function detectV2(own: Map<string, string>): Layout | undefined {
  const controllers = readText(path.join(CGROUP_ROOT, 'cgroup.controllers'))
  if (controllers === undefined) return undefined
  const ownPath = own.get('')
  if (ownPath === undefined) return undefined
  const base = path.join(CGROUP_ROOT, ownPath)
  const wanted = ['memory', 'pids', 'cpu'].filter((name) =>
    (readText(path.join(base, 'cgroup.controllers')) ?? '').split(/\s+/).includes(name),
  )
  if (wanted.length === 0)
    return {
      support: {
        mode: 'none',
        enforced: none(),
        how: `cgroup v2 is mounted but ${base} offers no memory, pids or cpu controller to this process`,
      },
      parents: [],
    }
  const runs = path.join(base, RUNS_DIR)
  try {
    enableControllers(base, wanted, ownPath === '/')
    fs.mkdirSync(runs, {recursive: true})
    fs.writeFileSync(path.join(runs, 'cgroup.subtree_control'), wanted.map((name) => `+${name}`).join(' '))
  } catch (error) {
    return {
      support: {
        mode: 'none',
        enforced: none(),
        how: `cgroup v2: cannot create run cgroups under ${base} (${(error as Error).message}); run the gateway as root in a unit of its own, or under a delegated one (systemd-run --user -p Delegate=yes meepagateway serve)`,
      },
      parents: [],
    }
  }
  const enforced = {memory: wanted.includes('memory'), pids: wanted.includes('pids'), cpu: wanted.includes('cpu')}
  return {
    support: {mode: 'v2', enforced, how: `cgroup v2: one cgroup per run under ${runs}`},
    parents: [{controller: 'unified', dir: runs}],
  }
}

/**
 * v2 allows controllers below a cgroup only when it has no processes of its own: the gateway moves
 * itself (never another process) into a leaf first. With other processes in its cgroup (a login
 * session) the write fails with EBUSY, and the caller reports how to give the gateway its own unit.
 */
function enableControllers(base: string, wanted: string[], isRoot: boolean): void {
  const control = path.join(base, 'cgroup.subtree_control')
  const enabled = (readText(control) ?? '').split(/\s+/)
  const missing = wanted.filter((name) => !enabled.includes(name))
  if (missing.length === 0) return
  if (!isRoot) {
    const leaf = path.join(base, 'meepa-gateway')
    fs.mkdirSync(leaf, {recursive: true})
    fs.writeFileSync(path.join(leaf, 'cgroup.procs'), String(process.pid))
  }
  fs.writeFileSync(control, missing.map((name) => `+${name}`).join(' '))
}

function detectV1(own: Map<string, string>): Layout | undefined {
  const parents: Layout['parents'] = []
  for (const controller of V1_CONTROLLERS) {
    const mount = path.join(CGROUP_ROOT, controller)
    const ownPath = own.get(controller)
    if (ownPath === undefined || !fs.existsSync(path.join(mount, 'cgroup.procs'))) continue
    const dir = path.join(mount, ownPath, 'meepagateway')
    if (canCreateIn(dir)) parents.push({controller, dir})
  }
  if (parents.length === 0) return undefined
  const has = (name: V1Controller) => parents.some((parent) => parent.controller === name)
  const enforced = {memory: has('memory'), pids: has('pids'), cpu: has('cpu')}
  return {
    support: {
      mode: 'v1',
      enforced,
      how: `cgroup v1: one cgroup per run in the ${parents.map((parent) => parent.controller).join(', ')} hierarchies (${parents[0]?.dir} ...)`,
    },
    parents,
  }
}

function none(): Record<LimitName, boolean> {
  return {memory: false, pids: false, cpu: false}
}

function detect(): Layout {
  if (process.platform !== 'linux')
    return {support: {mode: 'none', enforced: none(), how: `no cgroups on ${process.platform}`}, parents: []}
  const own = ownCgroups()
  const v2 = detectV2(own)
  if (v2?.support.mode === 'v2') return v2
  const v1 = detectV1(own)
  if (v1) return v1
  return (
    v2 ?? {
      support: {
        mode: 'none',
        enforced: none(),
        how: 'this process cannot create cgroups (not root, and no delegated cgroup v2 slice)',
      },
      parents: [],
    }
  )
}

/** How run limits are enforced on this host (detected once per process). */
export function cgroupSupport(): CgroupSupport {
  cached ??= detect()
  return cached.support
}

export interface RunCgroup {
  /** Every directory the run's processes join (the helper's --cgroup arguments). */
  dirs: string[]
  /** Processes the kernel OOM-killed in the run so far. */
  oomKills(): number
  /** Times a fork was refused because the run reached its pids limit. */
  pidsLimitHits(): number
}

/** Creates the cgroup(s) of one run with its limits; undefined when this host cannot. */
export function createRunCgroup(runId: string, limits: RunLimits): RunCgroup | undefined {
  cached ??= detect()
  const {parents} = cached
  if (parents.length === 0) return undefined
  const dirs: string[] = []
  const name = runId.replace(/[^A-Za-z0-9_-]/g, '_')
  try {
    for (const parent of parents) {
      const dir = path.join(parent.dir, name)
      fs.mkdirSync(dir)
      dirs.push(dir)
      writeLimits(parent.controller, dir, limits)
    }
  } catch (error) {
    removeRunCgroups(dirs)
    throw new Error(`cannot create the run's cgroup: ${(error as Error).message}`, {cause: error})
  }
  const memoryDir = dirs.find((dir) =>
    parents.some(
      (parent) =>
        dir.startsWith(`${parent.dir}/`) && (parent.controller === 'memory' || parent.controller === 'unified'),
    ),
  )
  const pidsDir = dirs.find((dir) =>
    parents.some(
      (parent) => dir.startsWith(`${parent.dir}/`) && (parent.controller === 'pids' || parent.controller === 'unified'),
    ),
  )
  return {
    dirs,
    oomKills: () => counter(memoryDir, ['memory.events', 'memory.oom_control'], 'oom_kill'),
    pidsLimitHits: () => counter(pidsDir, ['pids.events'], 'max'),
  }
}

function counter(dir: string | undefined, files: string[], key: string): number {
  if (!dir) return 0
  for (const file of files) {
    const text = readText(path.join(dir, file))
    const value = text === undefined ? undefined : new RegExp(`^${key} (\\d+)$`, 'm').exec(text)?.[1]
    if (value !== undefined) return Number(value)
  }
  return 0
}

const CPU_PERIOD_US = 100_000

function writeLimits(controller: V1Controller | 'unified', dir: string, limits: RunLimits): void {
  const write = (file: string, value: string | number, optional = false) => {
    try {
      fs.writeFileSync(path.join(dir, file), String(value))
    } catch (error) {
      if (!optional) throw error
    }
  }
  switch (controller) {
    case 'unified':
      if (fs.existsSync(path.join(dir, 'memory.max'))) {
        write('memory.max', limits.memoryBytes)
        write('memory.swap.max', 0, true) // swap would let a hog run past the limit, slowly
        write('memory.oom.group', 1, true)
      }
      if (fs.existsSync(path.join(dir, 'pids.max'))) write('pids.max', limits.pids)
      if (fs.existsSync(path.join(dir, 'cpu.max'))) writeCpuLimit(controller, dir, limits.cpus)
      break
    case 'memory':
      write('memory.limit_in_bytes', limits.memoryBytes)
      write('memory.memsw.limit_in_bytes', limits.memoryBytes, true) // no swap beyond the limit, where accounted
      break
    case 'pids':
      write('pids.max', limits.pids)
      break
    case 'cpu':
      writeCpuLimit(controller, dir, limits.cpus)
      break
    case 'freezer':
      break
  }
}

/** A CPU limit of `cpus` CPUs on a v1 cpu directory or a v2 one. */
function writeCpuLimit(controller: 'cpu' | 'unified', dir: string, cpus: number): void {
  const quota = Math.max(1000, Math.round(cpus * CPU_PERIOD_US))
  if (controller === 'unified') {
    fs.writeFileSync(path.join(dir, 'cpu.max'), `${quota} ${CPU_PERIOD_US}`)
    return
  }
  fs.writeFileSync(path.join(dir, 'cpu.cfs_period_us'), String(CPU_PERIOD_US))
  fs.writeFileSync(path.join(dir, 'cpu.cfs_quota_us'), String(quota))
}

/** Pids listed in a run cgroup directory (none once it is gone). */
export function cgroupPids(dir: string): number[] {
  return (readText(path.join(dir, 'cgroup.procs')) ?? '').split('\n').filter(Boolean).map(Number)
}

/**
 * Kills every process in these cgroups (the keeper normally does it; this is for a keeper that
 * died): cgroup.kill on v2, freeze + kill + thaw on v1, then rounds until they are empty.
 */
export function killRunCgroups(dirs: string[]): void {
  const killAll = () => {
    let found = 0
    for (const dir of dirs) {
      for (const pid of cgroupPids(dir)) {
        found++
        try {
          process.kill(pid, 'SIGKILL')
        } catch {
          // exited meanwhile
        }
      }
    }
    return found
  }
  if (dirs.every((dir) => cgroupPids(dir).length === 0)) return // the keeper left nothing (the usual case)
  for (const dir of dirs) {
    try {
      fs.writeFileSync(path.join(dir, 'cgroup.kill'), '1')
    } catch {
      // v1, or gone
    }
  }
  const freezer = dirs.find((dir) => fs.existsSync(path.join(dir, 'freezer.state')))
  if (freezer) {
    try {
      fs.writeFileSync(path.join(freezer, 'freezer.state'), 'FROZEN')
      killAll()
      fs.writeFileSync(path.join(freezer, 'freezer.state'), 'THAWED')
    } catch {
      // gone
    }
  }
  const deadline = Date.now() + 2000
  while (killAll() > 0 && Date.now() < deadline) Atomics.wait(new Int32Array(new SharedArrayBuffer(4)), 0, 0, 5)
}

/**
 * For a start-up reclaiming a dead keeper's run (not at every run's end: a live owner's keeper is
 * in its own pid namespace, where killRunCgroups sees and kills a frozen run). A keeper killed in
 * the middle of its kill leaves the run frozen. Members this process cannot see (another pid
 * namespace: cgroup.procs looks empty from here) usually have SIGKILL pending, their namespace
 * having died with the keeper: thawed, they die and the cgroup empties. If it does not empty within
 * 50 ms, they were frozen before any kill: they are frozen again and the cgroup is left, reported
 * by removeRunCgroups, for a start-up that can see them.
 */
export function thawUnseenFrozen(dirs: string[]): void {
  for (const dir of dirs) thawIfUnseen(dir)
}

function thawIfUnseen(dir: string): void {
  const state = path.join(dir, 'freezer.state')
  try {
    if (!/^(FROZEN|FREEZING)/.test(fs.readFileSync(state, 'utf8')) || cgroupPids(dir).length > 0) return
    fs.writeFileSync(state, 'THAWED')
  } catch {
    return // not a freezer cgroup, or gone
  }
  for (let attempt = 0; attempt < 10; attempt++) {
    try {
      fs.rmdirSync(dir)
      return
    } catch {
      Atomics.wait(new Int32Array(new SharedArrayBuffer(4)), 0, 0, 5)
    }
  }
  try {
    fs.writeFileSync(state, 'FROZEN')
  } catch {
    // emptied and removed meanwhile
  }
}

/**
 * Removes the run's (empty) cgroup directories, retried briefly while the last processes exit;
 * returns those still there (processes this process cannot see or kill: another pid namespace,
 * or frozen by a keeper that died before its kill).
 */
export function removeRunCgroups(dirs: string[]): string[] {
  const left: string[] = []
  for (const dir of dirs) {
    for (let attempt = 0; attempt < 50; attempt++) {
      try {
        fs.rmdirSync(dir)
        break
      } catch (error) {
        const code = (error as NodeJS.ErrnoException).code
        if (code === 'ENOENT') break
        // members we can see are dying (waited for); none we can see: nothing here will change soon
        if (code !== 'EBUSY' || attempt === 49 || (attempt >= 3 && cgroupPids(dir).length === 0)) {
          left.push(dir)
          break
        }
        Atomics.wait(new Int32Array(new SharedArrayBuffer(4)), 0, 0, 10)
      }
    }
  }
  return left
}

/** Each background walk gets at most this share of one CPU. */
const WALK_CPUS = 0.5
const WALKS_DIR = 'meepa-walks'
let walksParent: {dir: string; controller: 'cpu' | 'unified'} | null | undefined
let walkCount = 0

export interface WalkCgroup {
  /** The directories the walk's process joins ([] where there is no such cgroup here). */
  dirs: string[]
  /** Removes them once the walk has ended. */
  remove(): void
}

/**
 * A cgroup for one background file walk of the gateway's (a workspace's hand-over): under
 * `meepa-walks`, beside the gateway's own cgroup and idle among its siblings (cpu.idle, else the
 * lowest weight), and capped at WALK_CPUS of one CPU. SCHED_IDLE alone still left another agent's
 * runs 10–11 % slower on two cores while a 300,000-file walk ran; with this, 1.04–1.07×
 * (bench/workspace-handover.ts). One cgroup per walk: one agent's walks never eat another's cap.
 * Without a cpu controller here, none (the walk then runs at SCHED_IDLE only).
 */
export function backgroundWalkCgroup(): WalkCgroup {
  const none = {dirs: [], remove: () => {}}
  const parent = walksCgroupParent()
  if (!parent) return none
  const dir = path.join(parent.dir, `walk-${process.pid}-${++walkCount}`)
  try {
    fs.mkdirSync(dir)
    writeCpuLimit(parent.controller, dir, WALK_CPUS)
  } catch {
    removeRunCgroups([dir])
    return none
  }
  return {dirs: [dir], remove: () => void removeRunCgroups([dir])}
}

/** `meepa-walks`, made once: beside the run cgroups' parent (a group under it would take its whole weight against the gateway's own process whenever no run is busy). */
function walksCgroupParent(): {dir: string; controller: 'cpu' | 'unified'} | null {
  if (walksParent !== undefined) return walksParent
  cached ??= detect()
  const runs = cached.parents.find((each) => each.controller === 'cpu' || each.controller === 'unified')
  walksParent = null
  if (!runs || !cached.support.enforced.cpu) return walksParent
  const controller = runs.controller === 'cpu' ? 'cpu' : 'unified'
  const dir = path.join(path.dirname(runs.dir), WALKS_DIR)
  const write = (file: string, value: string) => fs.writeFileSync(path.join(dir, file), value)
  try {
    fs.mkdirSync(dir, {recursive: true})
    // SCHED_IDLE for the group among its siblings where the kernel has it (5.15), else the lowest weight
    if (fs.existsSync(path.join(dir, 'cpu.idle'))) write('cpu.idle', '1')
    else write(controller === 'cpu' ? 'cpu.shares' : 'cpu.weight', controller === 'cpu' ? '2' : '1')
    // no cap of its own: each walk has its own (an older gateway's shared one is lifted)
    if (controller === 'cpu') write('cpu.cfs_quota_us', '-1')
    else {
      write('cpu.max', 'max')
      write('cgroup.subtree_control', '+cpu')
    }
    walksParent = {dir, controller}
  } catch {
    // no such cgroup here: SCHED_IDLE alone
  }
  return walksParent
}

/** For tests: forget the detected layout. */
export function resetCgroupSupportForTests(): void {
  cached = undefined
  walksParent = undefined
}
