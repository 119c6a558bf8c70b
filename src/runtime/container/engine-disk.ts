import crypto from 'node:crypto'
import fs from 'node:fs'
import path from 'node:path'
import type {DockerCli} from '../../sandbox/docker/cli.js'
import {CONTAINER_WORKSPACE} from '../../sandbox/docker/run-args.js'
import {GatewayError} from '../util/errors.js'
import {writeWholeFile} from '../util/write-whole-file.js'
import {engineDiskFile, engineDisksVolume} from './engine-state.js'
import {ownContainerArgs} from './own-container.js'

/**
 * limits.disk held by the kernel on a remote Docker engine (docs/architecture.md, "Workspaces on
 * remote engines"): the agent's volume there is an ext4 image of exactly the limit, kept in this
 * home's disks volume on that engine and attached to a loop device by a short setup container of
 * the gateway's own (CAP_SYS_ADMIN, loop devices only); the workspace volume is a local volume of
 * `type=ext4, device=/dev/loopN`, which the engine mounts `nosuid,nodev` for each container.
 *
 * A loop device does not survive the engine's host: after a reboot /dev/loopN is gone, or backs
 * another file. So every container that mounts the volume first compares the mounted
 * filesystem's id (statfs f_fsid, which ext4 derives from the image's UUID, out of an agent's
 * reach) with the one recorded here, and exits before doing anything else when they differ; the
 * engine refusing the mount ends the same way. The run is then placed again once, after the image
 * is attached anew, on a volume whose content the host sends whole.
 */

/** What the host knows of an agent's disk image on an engine. */
export interface EngineDisk {
  /** The image's file name in the disks volume. */
  image: string
  uuid: string
  /** The loop device it was attached to, which the workspace volume names. */
  device: string
  /** statfs f_fsid of the filesystem as GNU `stat -f -c %i` prints it. */
  fsid: string
  bytes: number
}

/** The exit status of a container whose volume is not the agent's filesystem. */
export const WRONG_VOLUME_EXIT = 96
const WRONG_VOLUME_MARK = 'meepa: the workspace volume is not this agent'

/** Below this a journal would take most of the space (as for the host's volumes). */
const JOURNAL_FROM_BYTES = 256 * 1024 ** 2
const SETUP_TIMEOUT_MS = 120_000
const DISKS = '/disks'

/** The engine lost the agent's volume (its loop device is gone, or backs another file): attach it again. */
export class EngineVolumeLost extends GatewayError {
  constructor(engine: string | undefined, why: string) {
    super(
      'E_DISK',
      `the workspace volume${engine ? ` on engine ${engine}` : ''} is not this agent's filesystem any more (${why})`,
    )
    this.name = 'EngineVolumeLost'
  }
}

/** `stat -f -c %i` of an ext4 filesystem made with `uuid`: the kernel folds the UUID's two halves (little-endian) into f_fsid. */
export function fsidOf(uuid: string): string {
  const bytes = Buffer.from(uuid.replace(/-/g, ''), 'hex')
  const folded = bytes.readBigUInt64LE(0) ^ bytes.readBigUInt64LE(8)
  // GNU stat prints f_fsid's two words high-first: the low word of the fold, then its high word
  return (((folded & 0xffffffffn) << 32n) | (folded >> 32n)).toString(16)
}

/** The shell line every container mounting the volume runs first (undefined: no disk, nothing to check). */
export function volumeCheck(fsid: string | undefined): string {
  if (fsid === undefined) return ''
  return `[ "$(stat -f -c %i ${CONTAINER_WORKSPACE})" = ${fsid} ] || { echo '${WRONG_VOLUME_MARK}' >&2; exit ${WRONG_VOLUME_EXIT}; }`
}

/** Whether a container ended at volumeCheck, or the engine could not mount the volume at all. */
export function endedOnLostVolume(exitCode: number | undefined, stderr: string): boolean {
  if (exitCode === WRONG_VOLUME_EXIT && stderr.includes(WRONG_VOLUME_MARK)) return true
  // the docker CLI's own refusal (exit 125), not a line an agent's file name could put in a helper's stderr
  return (
    exitCode === 125 &&
    /^docker: Error response from daemon: (error while mounting volume|failed to mount local volume)/m.test(stderr)
  )
}

export function readEngineDisk(home: string, engine: string, agentId: string): EngineDisk | undefined {
  try {
    return JSON.parse(fs.readFileSync(engineDiskFile(home, engine, agentId), 'utf8')) as EngineDisk
  } catch {
    return undefined
  }
}

/** Forgets which loop device holds the image: the next setup looks again (the image stays). */
export function forgetEngineDiskDevice(home: string, engine: string, agentId: string): void {
  const disk = readEngineDisk(home, engine, agentId)
  if (disk) writeWholeFile(engineDiskFile(home, engine, agentId), JSON.stringify({...disk, device: ''}))
}

/** The setup container: our script as root with CAP_SYS_ADMIN, reaching loop devices only. */
function setupArgs(volumeOfDisks: string, image: string, labels: Record<string, string>, name: string): string[] {
  return ownContainerArgs({
    image,
    user: '0:0',
    labels,
    // LOOP_CONFIGURE and LOOP_CLR_FD need CAP_SYS_ADMIN
    caps: ['SYS_ADMIN'],
    volumes: [`${volumeOfDisks}:${DISKS}`],
    extra: [
      '--name',
      name,
      // the host's devtmpfs, so a loop device attached here is the one the engine mounts; not
      // recursively: none of the host's /dev/shm, /dev/pts or /dev/mqueue
      '--mount',
      'type=bind,src=/dev,dst=/dev,bind-nonrecursive=true',
      '--device-cgroup-rule',
      'b 7:* rwm',
      '--device-cgroup-rule',
      'c 10:237 rwm',
    ],
  })
}

/** A setup script run in the setup container, one at a time per disks volume (a lock file there). */
async function runSetup(
  cli: DockerCli,
  options: {volume: string; image: string; labels: Record<string, string>; script: string; args: string[]},
  signal?: AbortSignal,
) {
  const name = `meepa-disk-setup-${crypto.randomBytes(6).toString('hex')}`
  try {
    return await cli.exec(
      [
        ...setupArgs(options.volume, options.image, options.labels, name),
        '-c',
        `exec 9>${DISKS}/.lock && flock 9 || exit 1\n${options.script}`,
        'sh',
        ...options.args,
      ],
      {timeoutMs: SETUP_TIMEOUT_MS, signal},
    )
  } catch (error) {
    // a client that gave up (timeout, cancel) leaves its container running: never two at once
    await cli.exec(['rm', '--force', name], {timeoutMs: 30_000}).catch(() => {})
    throw error
  }
}

/**
 * Makes (the first time, or for a new size), checks and attaches the agent's image, prints its
 * loop device. Arguments: the image's name, its size, UUID and mkfs's journal option. Older
 * images of the agent (another size) are detached and removed.
 */
const ATTACH = [
  'set -e',
  `cd ${DISKS}`,
  'agent=${1%%.*}',
  'for old in "$agent".*.ext4; do',
  '  [ -f "$old" ] && [ "$old" != "$1" ] || continue',
  '  for dev in $(losetup -j "$old" -n -O NAME); do losetup -d "$dev" || true; done',
  '  rm -f "$old"',
  'done',
  'if [ ! -f "$1" ]; then',
  '  rm -f "$1.new"',
  '  fallocate -l "$2" "$1.new"',
  '  mkfs.ext4 -q -F -m 0 -E nodiscard -U "$3" $4 "$1.new" >&2',
  '  mv "$1.new" "$1"',
  'fi',
  // not in a pipe: a losetup that fails must stop here, never pass for "not attached"
  'held=$(losetup -j "$1" -n -O NAME)',
  'dev=$(echo "$held" | head -n 1)',
  // a journal-less image after a crash needs its check; a clean one passes in milliseconds
  'if [ -z "$dev" ]; then e2fsck -p "$1" >&2 || [ $? -eq 1 ]; dev=$(losetup -f --show "$1"); fi',
  'echo "$dev"',
].join('\n')

/**
 * The agent's volume on `engine` as a filesystem of `bytes`: its image made and attached, the
 * workspace volume naming that device (made again when it names another; containers still using
 * the old one, its standbys, are removed first). Throws E_DISK naming why and the fix.
 */
export async function attachEngineDisk(
  cli: DockerCli,
  options: {
    home: string
    engine: string
    homeLabel: string
    agentId: string
    volume: string
    bytes: number
    image: string
    labels: Record<string, string>
    signal?: AbortSignal
  },
): Promise<EngineDisk> {
  const known = readEngineDisk(options.home, options.engine, options.agentId)
  const uuid = known && known.bytes === options.bytes ? known.uuid : crypto.randomUUID()
  const image = `${options.agentId}.${uuid}.ext4`
  const journal = options.bytes >= JOURNAL_FROM_BYTES ? '' : '-O ^has_journal'
  const attached = await runSetup(
    cli,
    {
      volume: engineDisksVolume(options.homeLabel),
      image: options.image,
      labels: options.labels,
      script: ATTACH,
      args: [image, String(options.bytes), uuid, journal],
    },
    options.signal,
  )
  const device = attached.stdout.trim().split('\n').pop() ?? ''
  if (attached.exitCode !== 0 || !/^\/dev\/loop\d+$/.test(device))
    throw new GatewayError(
      'E_DISK',
      `engine ${options.engine} cannot hold limits.disk for agent ${options.agentId}: attaching its ${options.bytes}-byte disk image failed (exit ${attached.exitCode}): ${attached.stderr.trim().split('\n').slice(-2).join('; ')}`,
      {
        suggestions: [
          "the engine's dockerd must run as root on a host with loop devices, and the agent's image must have losetup, mkfs.ext4 and e2fsck (Debian: mount, e2fsprogs)",
          `or set best_effort: true on engine ${options.engine} to run there with limits.disk bounding only what comes back`,
        ],
      },
    )
  await volumeOnDevice(cli, options.volume, device, options.labels, options.signal)
  const disk: EngineDisk = {image, uuid, device, fsid: fsidOf(uuid), bytes: options.bytes}
  const file = engineDiskFile(options.home, options.engine, options.agentId)
  fs.mkdirSync(path.dirname(file), {recursive: true, mode: 0o700})
  writeWholeFile(file, JSON.stringify(disk))
  return disk
}

/** The workspace volume as a local volume mounting `device`; made again when it names another. */
async function volumeOnDevice(
  cli: DockerCli,
  volume: string,
  device: string,
  labels: Record<string, string>,
  signal?: AbortSignal,
): Promise<void> {
  const inspected = await cli.exec(['volume', 'inspect', '--format', '{{json .Options}}', volume], {signal})
  if (inspected.exitCode === 0) {
    const options = JSON.parse(inspected.stdout || 'null') as Record<string, string> | null
    if (options?.device === device && options.type === 'ext4') return
    const users = await cli.check(['ps', '-aq', '--filter', `volume=${volume}`], {signal})
    const ids = users.stdout.split('\n').filter(Boolean)
    if (ids.length > 0) await cli.check(['rm', '-f', ...ids], {signal})
    await cli.check(['volume', 'rm', volume], {signal})
  }
  await cli.check(
    [
      'volume',
      'create',
      '--driver',
      'local',
      '--opt',
      'type=ext4',
      '--opt',
      `device=${device}`,
      '--opt',
      'o=nosuid,nodev,noatime',
      ...Object.entries(labels).flatMap(([key, value]) => ['--label', `${key}=${value}`]),
      volume,
    ],
    {signal},
  )
}

/**
 * `container clean`: the disk images of these agents detached and removed from this home's disks
 * volume on the engine, and the volume itself once it holds none. Returns why it could not, if so.
 */
export async function removeEngineDisks(
  cli: DockerCli,
  options: {
    homeLabel: string
    agents: string[]
    image: string | undefined
    /** Every workspace volume of this home is gone from the engine: the disks volume goes too. */
    removeVolume: boolean
    signal?: AbortSignal
  },
): Promise<string | undefined> {
  if (options.agents.length === 0 && !options.removeVolume) return undefined
  const volume = engineDisksVolume(options.homeLabel)
  const exists = await cli.exec(['volume', 'inspect', volume], {signal: options.signal})
  if (exists.exitCode !== 0) return undefined
  if (!options.image) return 'no image of this home is left on the engine to detach its disk images with'
  const removed = await runSetup(
    cli,
    {
      volume,
      image: options.image,
      labels: {},
      // each named agent's images: every loop device holding one detached, then the file removed;
      // one still held is kept and named
      script: `cd ${DISKS} || exit 1\nfor agent in "$@"; do for image in $agent.*.ext4; do [ -f "$image" ] || continue; for dev in $(losetup -j "$image" -n -O NAME); do losetup -d "$dev"; done; if [ -n "$(losetup -j "$image" -n -O NAME)" ]; then echo "$image is still attached to a loop device" >&2; exit 1; fi; rm -f "$image"; done; done`,
      // unquoted in the loop as a pattern: an agent id (letters, digits, dashes) or `*`
      args: options.agents.filter((agent) => agent === '*' || /^[a-z0-9][a-z0-9-]*$/.test(agent)),
    },
    options.signal,
  )
  if (removed.exitCode !== 0) return removed.stderr.trim().split('\n').pop() ?? `exit ${removed.exitCode}`
  if (options.removeVolume) {
    const gone = await cli.exec(['volume', 'rm', volume], {signal: options.signal})
    if (gone.exitCode !== 0) return gone.stderr.trim().split('\n').pop() ?? `exit ${gone.exitCode}`
  }
  return undefined
}
