import crypto from 'node:crypto'
import fs from 'node:fs'
import path from 'node:path'
import type {DockerCli} from '../../sandbox/docker/cli.js'
import {CONTAINER_WORKSPACE} from '../../sandbox/docker/run-args.js'
import {GatewayError} from '../util/errors.js'
import {LOST_VOLUME_EXIT, LOST_VOLUME_MARK} from '../agent-run/workspace-changes.js'
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

/** Below this a journal would take most of the space (as for the host's volumes). */
const JOURNAL_FROM_BYTES = 256 * 1024 ** 2
const SETUP_TIMEOUT_MS = 120_000
const DISKS = '/disks'

/**
 * The engine lost the agent's volume (its loop device is gone, or backs another file; a plain
 * volume without the fill's token): attach or fill it again. Its code says the run's container
 * could not start on it (should it happen twice), never that the workspace is full.
 */
export class EngineVolumeLost extends GatewayError {
  constructor(engine: string | undefined, why: string) {
    super(
      'E_DOCKER',
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
  return `[ "$(stat -f -c %i ${CONTAINER_WORKSPACE})" = ${fsid} ] || { echo '${LOST_VOLUME_MARK}' >&2; exit ${LOST_VOLUME_EXIT}; }`
}

/** Whether a container ended at volumeCheck, or the engine could not mount the volume at all. */
export function endedOnLostVolume(exitCode: number | undefined, stderr: string): boolean {
  if (exitCode === LOST_VOLUME_EXIT && stderr.includes(LOST_VOLUME_MARK)) return true
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

/** The setup container: our script as root with CAP_SYS_ADMIN, reaching only the loop devices it is handed. */
export function setupArgs(
  volumeOfDisks: string,
  image: string,
  labels: Record<string, string>,
  name: string,
  /** The loop devices (major:minor) it may open; none: it may only ask /dev/loop-control for a free one. */
  devices: string[],
): string[] {
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
      'c 10:237 rwm',
      ...devices.flatMap((device) => ['--device-cgroup-rule', `b ${device} rwm`]),
    ],
  })
}

/** A setup script run in the setup container, one at a time per disks volume (a lock file there). */
async function runSetup(
  cli: DockerCli,
  options: {
    volume: string
    image: string
    labels: Record<string, string>
    script: string
    args: string[]
    devices?: string[]
  },
  signal?: AbortSignal,
) {
  const name = `meepa-disk-setup-${crypto.randomBytes(6).toString('hex')}`
  try {
    return await cli.exec(
      [
        ...setupArgs(options.volume, options.image, options.labels, name, options.devices ?? []),
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
 * A shell function, `held PATTERN...`: `HELD <image> <device> <major:minor>` for each loop device
 * holding an image whose name matches a pattern, read from sysfs: a device's backing file ends in the
 * image's name (unique by its UUID), whatever container attached it. No device is opened.
 */
const HELD = [
  'held() {',
  '  for file in /sys/block/loop*/loop/backing_file; do',
  '    [ -r "$file" ] || continue',
  '    backing=$(cat "$file"); backing=${backing% (deleted)}; name=${backing##*/}',
  '    dev=${file#/sys/block/}; dev=${dev%%/*}',
  '    for wanted in "$@"; do case "$name" in $wanted) echo "HELD $name /dev/$dev $(cat /sys/block/$dev/dev)" ;; esac; done',
  '  done',
  '}',
].join('\n')

/** `make_fs IMAGE UUID JOURNAL-OPTION`: the agent's filesystem, empty, with the UUID its fsid is checked by. */
const MAKE_FS = 'make_fs() { mkfs.ext4 -q -F -m 0 -E nodiscard -U "$2" $3 "$1" >&2; }'

/**
 * First step of an attach, with no loop device reachable: makes the image when missing (the first
 * time, or for a new size), lists the devices holding the agent's images, and when the image
 * itself is not held asks for a free device (`FREE <device> <major:minor>`). Arguments: the image's
 * name, its size, UUID and mkfs's journal option.
 */
const LOOK = [
  'set -e',
  `cd ${DISKS}`,
  MAKE_FS,
  'if [ ! -f "$1" ]; then',
  '  rm -f "$1.new"',
  '  fallocate -l "$2" "$1.new"',
  '  make_fs "$1.new" "$3" "$4"',
  '  mv "$1.new" "$1"',
  'fi',
  HELD,
  'image=$1',
  'held=$(held "${1%%.*}.*.ext4")',
  '[ -z "$held" ] || echo "$held"',
  'case "$held" in *"HELD $image "*) ;; *) free=$(losetup -f); echo "FREE $free $(cat /sys/block/${free#/dev/}/dev)" ;; esac',
].join('\n')

/**
 * Second step, reaching only the devices the first named: older images of the agent (another size)
 * detached and removed; the image checked and attached to the free device, unless held already.
 * Arguments: the image, its UUID and mkfs's journal option, then `device` pairs to detach
 * (`-d DEVICE`) and the one to attach (`-a DEVICE`).
 */
const ATTACH = [
  'set -e',
  `cd ${DISKS}`,
  MAKE_FS,
  'image=$1; uuid=$2; journal=$3; shift 3',
  'while [ $# -gt 1 ]; do',
  '  case "$1" in',
  '    -d) losetup -d "$2" ;;',
  // Checked first: a clean one passes in milliseconds. One e2fsck cannot repair is made anew:
  // an image attached anew holds nothing the host will read (its content is sent whole), and
  // its mount has no barriers (VOLUME_MOUNT_OPTIONS), so a crash of its host may leave it so.
  '    -a) e2fsck -p "$image" >&2 || [ $? -eq 1 ] || make_fs "$image" "$uuid" "$journal"; losetup "$2" "$image" ;;',
  '  esac',
  '  shift 2',
  'done',
  'for old in "${image%%.*}".*.ext4; do [ ! -f "$old" ] || [ "$old" = "$image" ] || rm -f "$old"; done',
].join('\n')

interface Held {
  image: string
  device: string
  number: string
}

function parseHeld(stdout: string): {held: Held[]; free?: Held} {
  const held: Held[] = []
  let free: Held | undefined
  for (const line of stdout.split('\n')) {
    const [kind, first, second, third] = line.trim().split(' ')
    if (kind === 'HELD' && first && /^\/dev\/loop\d+$/.test(second ?? '') && /^\d+:\d+$/.test(third ?? ''))
      held.push({image: first, device: second!, number: third!})
    if (kind === 'FREE' && /^\/dev\/loop\d+$/.test(first ?? '') && /^\d+:\d+$/.test(second ?? ''))
      free = {image: '', device: first!, number: second!}
  }
  return {held, free}
}

/** The image made and attached in two steps (LOOK, then ATTACH reaching only the devices named); its device. */
async function attachImage(
  cli: DockerCli,
  options: Parameters<typeof attachEngineDisk>[1],
  image: string,
  uuid: string,
  journal: string,
): Promise<string> {
  const volume = engineDisksVolume(options.homeLabel)
  const failed = (exitCode: number | undefined, stderr: string) =>
    new GatewayError(
      'E_DISK',
      `engine ${options.engine} cannot hold limits.disk for agent ${options.agentId}: attaching its ${options.bytes}-byte disk image failed (exit ${exitCode}): ${stderr.trim().split('\n').slice(-2).join('; ')}`,
      {
        suggestions: [
          "the engine's dockerd must run as root on a host with loop devices, and the agent's image must have losetup, mkfs.ext4 and e2fsck (Debian: mount, e2fsprogs)",
          `or set best_effort: true on engine ${options.engine} to run there with limits.disk bounding only what comes back`,
        ],
      },
    )
  let last: {exitCode: number; stderr: string} = {exitCode: 0, stderr: ''}
  // a free device another host process takes first fails the attach: asked again, twice at most
  for (let attempt = 0; attempt < 3; attempt++) {
    const looked = await runSetup(
      cli,
      {
        volume,
        image: options.image,
        labels: options.labels,
        script: LOOK,
        args: [image, String(options.bytes), uuid, journal],
      },
      options.signal,
    )
    if (looked.exitCode !== 0) throw failed(looked.exitCode, looked.stderr)
    const {held, free} = parseHeld(looked.stdout)
    const mine = held.find((entry) => entry.image === image)
    const older = held.filter((entry) => entry.image !== image)
    if (mine && older.length === 0) return mine.device
    const attach = mine ? undefined : free
    if (!mine && !attach) throw failed(looked.exitCode, 'no free loop device')
    const attached = await runSetup(
      cli,
      {
        volume,
        image: options.image,
        labels: options.labels,
        script: ATTACH,
        args: [
          image,
          uuid,
          journal,
          ...older.flatMap((entry) => ['-d', entry.device]),
          ...(attach ? ['-a', attach.device] : []),
        ],
        devices: [...older, ...(attach ? [attach] : [])].map((entry) => entry.number),
      },
      options.signal,
    )
    if (attached.exitCode === 0) return (mine ?? attach)!.device
    last = attached
  }
  throw failed(last.exitCode, last.stderr)
}

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
  const device = await attachImage(cli, options, image, uuid, journal)
  await volumeOnDevice(cli, options.volume, device, options.labels, options.signal)
  const disk: EngineDisk = {image, uuid, device, fsid: fsidOf(uuid), bytes: options.bytes}
  const file = engineDiskFile(options.home, options.engine, options.agentId)
  fs.mkdirSync(path.dirname(file), {recursive: true, mode: 0o700})
  writeWholeFile(file, JSON.stringify(disk))
  return disk
}

/**
 * How the engine mounts the agent's filesystem. No barriers: the volume is a copy whose content
 * the host forgets whenever the image is attached anew (as after a crash of the engine's host),
 * so ordering its writes to the disk buys nothing, and each fsync of the agent's (SQLite's
 * memory.db at every run's end) would otherwise wait for the image's own disk.
 */
const VOLUME_MOUNT_OPTIONS = 'nosuid,nodev,noatime,nobarrier'

/** The workspace volume as a local volume mounting `device`; made again when it names another or mounts otherwise. */
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
    if (options?.device === device && options.type === 'ext4' && options.o === VOLUME_MOUNT_OPTIONS) return
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
      `o=${VOLUME_MOUNT_OPTIONS}`,
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
  // unquoted in the scripts as patterns: an agent id (letters, digits, dashes) or every image
  const patterns = options.agents
    .filter((agent) => agent === '*' || /^[a-z0-9][a-z0-9-]*$/.test(agent))
    .map((agent) => `${agent}.*.ext4`)
  const listed = await runSetup(
    cli,
    {volume, image: options.image, labels: {}, script: `${HELD}\nheld "$@"`, args: patterns},
    options.signal,
  )
  if (listed.exitCode !== 0) return listed.stderr.trim().split('\n').pop() ?? `exit ${listed.exitCode}`
  const {held} = parseHeld(listed.stdout)
  const removed = await runSetup(
    cli,
    {
      volume,
      image: options.image,
      labels: {},
      // every device holding one detached (reaching only those), then the files removed once none does
      script: [
        `cd ${DISKS} || exit 1`,
        'while [ "$1" = -d ]; do losetup -d "$2" || exit 1; shift 2; done; shift',
        HELD,
        'if [ -n "$(held "$@")" ]; then echo "an image is still attached to a loop device" >&2; exit 1; fi',
        'for pattern in "$@"; do for image in $pattern; do [ ! -f "$image" ] || rm -f "$image"; done; done',
      ].join('\n'),
      args: [...held.flatMap((entry) => ['-d', entry.device]), '--', ...patterns],
      devices: held.map((entry) => entry.number),
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
