import crypto from 'node:crypto'
import fs from 'node:fs'
import path from 'node:path'
import type {DockerCli} from '../../../sandbox/docker/cli.js'
import {LABEL} from '../../../sandbox/docker/dockerfile.js'
import {removeContainers} from '../../../sandbox/docker/containers.js'
import {CONTAINER_TMP_SIZE, CONTAINER_WORKSPACE} from '../../../sandbox/docker/run-args.js'
import {GatewayError, toGatewayError} from '../../util/errors.js'
import {DockerCommandError} from '../../../sandbox/docker/errors.js'
import {bufferSource, type ByteSource} from '../../util/spooled-bytes.js'
import {tarEntries, writeTar, type TarHeaderEntry, type TarInput} from '../../util/tar.js'
import {folderSyncRefused, removeWholeFile, writeWholeFile, writeWholeFileAside} from '../../util/write-whole-file.js'
import {bootId} from '../../../sandbox/probe-record.js'
import {readRegularFile} from '../../util/regular-file.js'
import {syncStateFile, syncVolumePrefix} from '../../container/engine-state.js'
import {syncSpoolDir} from '../../util/paths.js'
import {
  lstatWorkspaceEntry,
  makeWorkspaceDirectory,
  makeWorkspaceSymlink,
  removeEmptyWorkspaceDirectory,
  removeWorkspaceEntry,
  WorkspaceRefusal,
  writeWorkspaceFile,
  writeWorkspaceFileInTurns,
} from '../../workspace/files.js'
import {GATEWAY_ENTRIES} from '../../workspace/workspace.js'
import {volumeCheck} from '../../container/engine-disk.js'
import {ownContainerArgs} from '../../container/own-container.js'
import {
  FILL_TOKEN,
  LOST_VOLUME_EXIT,
  LostVolume,
  SYNC_DIR,
  SYNC_FILL,
  SYNC_TRAILER,
  syncToken,
  WORKSPACE_SYNC_ENV,
} from '../../agent-run/workspace-changes.js'
import {splitSyncTrailer, type SyncTrailer} from './sync-trailer.js'

/**
 * An agent's workspace on an engine that cannot mount the host's path (docs/architecture.md,
 * "Workspaces on remote engines"): a volume per agent on that engine, the host's workspace the one
 * truth. Before a run only what changed on the host since the last sync goes there (nothing, when
 * nothing did); the run's container lists what it changed and the host takes those files back
 * through the no-follow writer. A run whose changes did not come back leaves the volume unknown:
 * the next run there starts from a fresh copy of the host's workspace.
 */

/** path -> [size, mtimeMs, 'f' | 'd' | 'l'] of the host's regular files, directories and symbolic links. */
export type Snapshot = Record<string, [number, number, 'f' | 'd' | 'l']>

/** The regular files, directories and symbolic links of the workspace; FIFOs, sockets and devices are never sent. */
export function snapshotWorkspace(root: string): Snapshot {
  const found: Snapshot = {}
  const walk = (dir: string, prefix: string) => {
    for (const entry of fs.readdirSync(dir, {withFileTypes: true})) {
      const relative = prefix ? `${prefix}/${entry.name}` : entry.name
      if (!prefix && entry.name === SYNC_DIR) continue
      const stat = fs.lstatSync(path.join(dir, entry.name))
      if (stat.isDirectory()) {
        found[relative] = [0, 0, 'd']
        walk(path.join(dir, entry.name), relative)
      } else if (stat.isFile()) found[relative] = [stat.size, stat.mtimeMs, 'f']
      else if (stat.isSymbolicLink()) found[relative] = [stat.size, stat.mtimeMs, 'l']
    }
  }
  walk(root, '')
  return found
}

/** The image, user and labels of the short containers that work on an agent's volume. */
export interface HelperOptions {
  image: string
  uid: number
  gid: number
  labels: Record<string, string>
  /** The volume's filesystem id when it is the agent's disk image (engine-disk.ts): checked first. */
  fsid?: string
}

export interface SyncedVolume {
  volume: string
  /** The volume's content as last synced (the host's snapshot then); undefined: unknown, copy it whole. */
  synced: Snapshot | undefined
  /** The token the push that filled the volume left in it (SYNC_FILL): without it the volume is unknown. */
  fill?: string
  /**
   * Changes whenever the volume may have: the run whose changes were taken back last, or a push
   * that wrote. A standby's names taken at one generation are the start's only at the same one.
   */
  generation?: string
  file: string
  /** Where a run's changes wait past what memory holds while they are taken back (sync-trailer.ts). */
  spoolDir: string
}

/** The agent's volume on an engine and what the host knows of its content. */
export function syncedVolume(home: string, engine: string, homeLabel: string, agentId: string): SyncedVolume {
  const volume = `${syncVolumePrefix(homeLabel)}${agentId}`
  const file = syncStateFile(home, engine, agentId)
  let record: {fill?: unknown; files?: unknown; unsettledIn?: unknown; generation?: unknown} | undefined
  try {
    record = JSON.parse(fs.readFileSync(file, 'utf8')) as typeof record
  } catch {
    record = undefined
  }
  // a record without a fill token (an older gateway's) is of an unknown volume: filled whole once;
  // one written before its take-back reached the disk holds only within the boot that wrote it
  const known =
    typeof record?.fill === 'string' &&
    FILL_TOKEN.test(record.fill) &&
    typeof record.files === 'object' &&
    (record.unsettledIn === undefined || record.unsettledIn === thisBoot())
  return {
    volume,
    synced: known ? (record!.files as Snapshot) : undefined,
    fill: known ? (record!.fill as string) : undefined,
    generation: known && typeof record!.generation === 'string' ? record!.generation : undefined,
    file,
    spoolDir: syncSpoolDir(home),
  }
}

/**
 * The record is durable, and so is forgetting it: one a crash took back to an earlier message's
 * would miss names the host removed since (the volume would keep them) and the names marked
 * unlike; one back from before a run whose changes never came would be trusted. A take-back's
 * record is first written `unsettledIn` this boot, not yet durable, and then again once its files
 * are (pullWorkspace): another boot never trusts the first.
 */
function remember(state: SyncedVolume, snapshot: Snapshot | undefined, unsettledIn?: string): void {
  state.synced = snapshot
  if (!snapshot) {
    state.fill = undefined
    state.generation = undefined
    removeWholeFile(state.file)
    return
  }
  fs.mkdirSync(path.dirname(state.file), {recursive: true, mode: 0o700})
  writeWholeFile(state.file, recordText(state, snapshot, unsettledIn), unsettledIn ? {durable: false} : {})
}

function recordText(state: SyncedVolume, files: Snapshot, unsettledIn?: string): string {
  return JSON.stringify({
    fill: state.fill,
    files,
    ...(state.generation ? {generation: state.generation} : {}),
    ...(unsettledIn ? {unsettledIn} : {}),
  })
}

let bootOfThisProcess: string | null | undefined
/** The machine's boot id (Linux), read once; null where there is none. */
function thisBoot(): string | null {
  return (bootOfThisProcess ??= bootId())
}

/** Forgets what the volume holds: the next run copies the host's workspace whole. */
export function forgetVolume(state: SyncedVolume): void {
  remember(state, undefined)
}

/** An unknown volume is emptied first (what the agent made unwritable made writable again: it owns it all). */
const EMPTY_VOLUME = '{ chmod -R u+rwx . 2>/dev/null; find . -mindepth 1 -delete; } && '

/**
 * A volume the host filled holds the sync's folder with the fill's token, written once the fill
 * is whole (filledWith); one without that token was lost and made anew on the engine, or filled by
 * another gateway, and ends the push as lost (LostVolume) before anything is written. The agent
 * owns the file: only its first 64 bytes are read (a sparse file of 200 GB would hold a `read` for
 * the push's whole timeout, and the engine would be marked down).
 */
const filledWith = (fill: string) => `mkdir -m 700 ${SYNC_DIR} && echo ${fill} > ${SYNC_DIR}/${SYNC_FILL}`
const stillFilledWith = (fill: string) =>
  `{ { [ -d ${SYNC_DIR} ] && [ ! -L ${SYNC_DIR} ] && [ -f ${SYNC_DIR}/${SYNC_FILL} ] && [ ! -L ${SYNC_DIR}/${SYNC_FILL} ] && [ "$(head -c 64 ${SYNC_DIR}/${SYNC_FILL})" = ${fill} ]; } || { echo '${new LostVolume().message.replace(/'/g, "'\\''")}' >&2; exit ${LOST_VOLUME_EXIT}; }; }`

/**
 * Clears names in the volume before a push's tar is extracted, given NUL-separated on stdin (never
 * as arguments: a push removing thousands of long names would not fit in an argv), each after one
 * letter: `r` removes whatever is there; `d` removes it unless it is a folder (a link to one is
 * not), which tar then keeps with what it holds. Any name not removed fails the push.
 */
const CLEAR_NAMES = `xargs -0r sh -c 'for entry; do name="./\${entry#?}"; case $entry in d*) [ -d "$name" ] && [ ! -L "$name" ] && continue;; esac; rm -rf -- "$name" || exit 1; done' sh`

/**
 * The clear list's `$size` bytes from stdin, never one more (the tar follows): GNU dd in 64 KiB
 * blocks, which reads only what is left for the last; one byte a read where dd lacks count_bytes
 * (busybox's, whose `head -c` reads past its count too). The push test that clears 2.4 MB of
 * names took 16.9 s with one byte a read, 5.9 s in blocks.
 */
const READ_CLEAR_LIST =
  '{ if dd if=/dev/null of=/dev/null iflag=count_bytes,fullblock 2>/dev/null; then dd bs=65536 iflag=count_bytes,fullblock count="$size"; else dd bs=1 count="$size"; fi; } 2>/dev/null'

/** A short container of the gateway's own on the agent's volume (own-container.ts). */
function helperArgs(
  volume: string,
  image: string,
  user: string,
  labels: Record<string, string>,
  more: {caps?: string[]; tmp?: boolean} = {},
): string[] {
  return ownContainerArgs({
    image,
    user,
    labels,
    stdin: true,
    caps: more.caps,
    volumes: [`${volume}:${CONTAINER_WORKSPACE}`],
    // a private /tmp where the change lists are written
    extra: more.tmp ? ['--tmpfs', `/tmp:rw,nosuid,nodev,size=${CONTAINER_TMP_SIZE}`] : [],
  })
}

interface PushOptions {
  workspace: string
  image: string
  uid: number
  gid: number
  labels: Record<string, string>
  /** The volume's filesystem id when it is the agent's disk image (engine-disk.ts): checked first. */
  fsid?: string
  signal?: AbortSignal
  /** Where a push tried again as a fill says why. */
  log?: (line: string) => void
}

/**
 * Brings the volume up to the host's workspace: nothing when the host has not changed since the
 * last sync; else removes what the host removed and sends the changed files in one tar stream. A
 * push that fails forgets what the volume holds, so a later one empties it and sends the host's
 * workspace whole, whatever this one left half done; one whose own steps failed in a known volume
 * does that at once.
 */
export async function pushWorkspace(
  cli: DockerCli,
  state: SyncedVolume,
  options: PushOptions,
): Promise<{sent: number; wrote: boolean}> {
  const host = snapshotWorkspace(options.workspace)
  // a volume is known by what it holds and the token of the fill that made it
  if (!state.fill) state.synced = undefined
  const synced = state.synced
  const changed = Object.keys(host).filter((name) => {
    const before = synced?.[name]
    const now = host[name]!
    return !before || before[2] !== now[2] || (now[2] !== 'd' && (before[0] !== now[0] || before[1] !== now[1]))
  })
  // gone from the host, or another kind there now (a folder that became a link): removed first
  const removed = synced
    ? Object.keys(synced).filter((name) => !(name in host) || synced[name]![2] !== host[name]![2])
    : []
  if (synced && changed.length === 0 && removed.length === 0) return {sent: 0, wrote: false}
  // a name the record does not know may be another kind in the volume (a folder of a run's that
  // the host refused, where the host now has a file): tar cannot put a file over a folder that
  // holds something, so what is there goes first unless it is the folder the host sends too
  const unknown = synced ? changed.filter((name) => !(name in synced)) : []
  const clear = [
    ...removed.map((name) => `r${name}`),
    ...unknown.map((name) => `${host[name]![2] === 'd' ? 'd' : 'r'}${name}`),
  ]
  try {
    return await sendChanges(cli, state, options, {host, changed, clear})
  } catch (error) {
    // a timeout, a cancel or an engine out of reach is only tried again (the push is repeatable)
    if (!(error instanceof DockerCommandError) || error.result.exitCode === DOCKER_OWN_FAILURE) throw error
    // the script ran and failed, or its client died: what the volume holds is unknown, a later push sends it whole
    forgetVolume(state)
    // its own steps failed in a known volume (a folder there the agent made unwritable, say):
    // filled whole at once, which first gives the run's user back its own folders, then empties
    // the volume; a client that died may have left its helper running there, so not at once
    if (!synced || error.result.exitCode !== PUSH_STEPS_FAILED) throw error
    options.log?.(
      `workspace sync: the push into volume ${state.volume} failed (${error.result.stderr.trim().split('\n').at(-1) ?? ''}); filling it whole`,
    )
    return await pushWorkspace(cli, state, options)
  }
}

/** `docker run`'s exit status when the engine, not the command, failed (the container never ran). */
const DOCKER_OWN_FAILURE = 125

/** The push helper's exit status when one of its own steps failed (not the lost-volume check, not its client). */
const PUSH_STEPS_FAILED = 97

/**
 * The agent's sync helpers still on the engine (a push whose docker client died while its helper
 * went on): removed before a fill, whose writes they would otherwise race.
 */
async function removeEarlierHelpers(cli: DockerCli, labels: Record<string, string>, signal?: AbortSignal) {
  const keys = [LABEL.home, LABEL.agent, LABEL.run]
  // only ever this home's and this agent's own
  if (keys.some((key) => !labels[key])) return
  const filters = keys.flatMap((key) => ['--filter', `label=${key}=${labels[key]}`])
  const left = (await cli.check(['ps', '-aq', ...filters], {timeoutMs: 60_000, signal})).stdout.split('\n')
  await removeContainers(cli, left.filter(Boolean), signal)
}

/** pushWorkspace's docker steps: the volume given to the run's user when new, then the names cleared and the tar. */
async function sendChanges(
  cli: DockerCli,
  state: SyncedVolume,
  options: PushOptions,
  push: {host: Snapshot; changed: string[]; clear: string[]},
): Promise<{sent: number; wrote: boolean}> {
  const {host, changed, clear} = push
  const synced = state.synced
  const fill = synced ? state.fill! : crypto.randomBytes(16).toString('hex')
  const labels = {...options.labels, [LABEL.run]: 'workspace-sync'}
  const checked = options.fsid ? `${volumeCheck(options.fsid)}\n` : ''
  if (!synced) {
    await removeEarlierHelpers(cli, labels, options.signal)
    // a new (or unknown) volume is given to the run's user: the one step as root, touching no agent data
    const rootArgs = helperArgs(state.volume, options.image, '0:0', labels, {caps: ['CHOWN']})
    // a new disk image's lost+found is root's: the agent could neither read nor list it
    const chown = `${checked}rmdir ${CONTAINER_WORKSPACE}/lost+found 2>/dev/null; chown ${options.uid}:${options.gid} ${CONTAINER_WORKSPACE}`
    await cli.check([...rootArgs, '-c', chown], {
      timeoutMs: 60_000,
      signal: options.signal,
    })
  }
  // what could not be read as it was walked (gone, unreadable, another kind now) is not sent, nor
  // recorded as the volume's: the next take-back must not remove it here, the next push tries again
  const notSent = (name: string): TarInput[] => {
    delete host[name]
    return []
  }
  const entries = changed.sort().flatMap((name): TarInput[] => {
    const [, mtimeMs, kind] = host[name]!
    if (kind === 'd') return [{name, type: '5', mode: 0o755, mtimeMs: Date.now(), data: Buffer.alloc(0)}]
    if (kind === 'l') {
      const linkname = linkTargetOf(path.join(options.workspace, name))
      return linkname ? [{name, type: '2', mode: 0o777, mtimeMs, data: Buffer.alloc(0), linkname}] : notSent(name)
    }
    const data = readRegularFile(path.join(options.workspace, name))
    return data ? [{name, type: '0', mode: 0o644, mtimeMs, data}] : notSent(name)
  })
  // the names to clear come first on stdin (their size on a line of its own, read exactly), then the tar
  const list = Buffer.from(clear.map((entry) => `${entry}\0`).join(''))
  const clearing = clear.length > 0 ? `read -r size && ${READ_CLEAR_LIST} | ${CLEAR_NAMES} && ` : ''
  const tar = writeTar(entries)
  await cli.check(
    [
      ...helperArgs(state.volume, options.image, `${options.uid}:${options.gid}`, labels),
      '-c',
      // the run's user owns the workspace: one it made unsearchable (chmod 000) is its own again
      `${checked}chmod u+rwx ${CONTAINER_WORKSPACE} 2>/dev/null; { cd ${CONTAINER_WORKSPACE} && ${synced ? `${stillFilledWith(fill)} && ` : EMPTY_VOLUME}${clearing}tar -x --no-same-owner -f -${synced ? '' : ` && ${filledWith(fill)}`}; } || exit ${PUSH_STEPS_FAILED}`,
    ],
    {
      input: clearing ? Buffer.concat([Buffer.from(`${list.length}\n`), list, tar]) : tar,
      timeoutMs: 120_000,
      signal: options.signal,
    },
  )
  state.fill = fill
  state.generation = `push-${crypto.randomBytes(8).toString('hex')}`
  remember(state, host)
  return {sent: entries.length, wrote: true}
}

/**
 * What changed in the volume since `$since` (nanoseconds since the epoch) on stdout, as the
 * trailer sync-trailer.ts reads: one walk puts every name in the list and the files and folders
 * changed since then in a second one (both in the container's own /tmp, never the volume), then
 * the header, the list, and the change tar streamed.
 */
const CHANGES_SINCE = [
  // nanoseconds since the epoch as find's time: @SECONDS.NANOSECONDS
  'seconds=${since%?????????}',
  // a folder of its own: nothing the agent planted in /tmp (a FIFO, a link) is read for them
  'lists=$(mktemp -d)',
  `cd ${CONTAINER_WORKSPACE} && [ -d ${SYNC_DIR} ]`,
  'newer="@$seconds.${since#"$seconds"}"',
  `find . -mindepth 1 -path ./${SYNC_DIR} -prune -o -fprint0 "$lists/all" \\( -type f -o -type d -o -type l \\) -newerct "$newer" -print0 > "$lists/newer"`,
  // a folder changed since (one renamed among them) brings everything below it: a rename leaves
  // its files' own times alone
  `find . -mindepth 1 -path ./${SYNC_DIR} -prune -o -type d -newerct "$newer" -print0 | xargs -0r sh -c 'find "$@" -mindepth 1 \\( -type f -o -type d -o -type l \\) -print0' sh > "$lists/below"`,
  // one entry each, parents before children
  'sort -zu "$lists/newer" "$lists/below" > "$lists/changed"',
  `printf '${SYNC_TRAILER} %s\\n' "$(stat -c %s "$lists/all")"`,
  'cat "$lists/all"',
  // hard links as files: the host makes no hard links
  'tar -c --null --no-recursion --hard-dereference --format=posix -f - -T "$lists/changed"',
].join(' && ')

/**
 * The run container's program on a sync engine: agent-run, told so (WORKSPACE_SYNC_ENV), as the
 * only child of the container's init. It reads the go line before its input and marks the run's
 * start in the volume; after its result frame it stops every other process and sends what changed
 * (agent-run/workspace-changes.ts, sync-trailer.ts). When no whole trailer comes, the host lists the
 * changes again from the volume (listChangesAgain). With `fsid`, a volume that is not the agent's
 * disk image ends the container before anything else (engine-disk.ts).
 */
export function syncingCommand(
  command: string[],
  /** The volume's filesystem id when it is the agent's disk image: checked before anything runs. */
  fsid?: string,
): {entrypoint: string; command: string[]} {
  // exec: agent-run's parent is then the container's init (PID 1, `--init`), which its kill of
  // every other process spares; the container ends with agent-run
  const script = [...(fsid ? [volumeCheck(fsid)] : []), `${WORKSPACE_SYNC_ENV}=1 exec "$@"`].join('\n')
  return {entrypoint: '/bin/sh', command: ['-c', script, 'sh', ...command]}
}

/** A link's target on the host, read without following it; undefined when it is no longer a link. */
function linkTargetOf(file: string): string | undefined {
  try {
    return fs.readlinkSync(file)
  } catch {
    return undefined
  }
}

/** A name from the engine, as a path inside the workspace; undefined for anything that could leave it. */
function safeName(raw: string): string | undefined {
  if (raw.includes('\0') || raw.startsWith('/')) return undefined
  // a backslash separates as the host's workspace writer reads it (`\.meepa-sync` is the sync's folder)
  const parts = raw.split(/[\\/]/).filter((part) => part !== '' && part !== '.')
  if (parts.length === 0 || parts.includes('..') || parts[0] === SYNC_DIR) return undefined
  return parts.join('/')
}

/**
 * Takes back what the run changed: files and directories through the no-follow writer, symbolic
 * links made (never followed) as the agent left them, names removed in the volume removed on the
 * host. FIFOs, devices, hard links and names with `..` are never made on the host (each is
 * logged). `maxBytes` bounds the whole transfer (limits.disk). A change the host fails to take
 * (applyChanges) fails it, and what the volume holds is forgotten.
 *
 * It returns once the changes are in place on the host (the next run sees them; losing the engine
 * now loses nothing). `settled` follows, on libuv's threads: the files and folders it wrote
 * fsynced, then the record; until then the record holds only in this boot (syncedVolume). A
 * power loss before even that record's rename is on the disk brings back the one before it
 * (docs/architecture.md, the known limit).
 */
export async function pullWorkspace(
  cli: DockerCli,
  state: SyncedVolume,
  options: {
    /** The run whose changes these are (its go line's): a volume whose mark another run set is refused. */
    runId: string
    /** Its go line said `pushed` (syncGoLine). */
    pushed: boolean
    workspace: string
    maxBytes: number
    log: (line: string) => void
    /** The list and change tar as the container sent them on stdout; else listed again from the volume. */
    trailer?: SyncTrailer
    /** Why the host could not hold the trailer that came (sync-trailer.ts): the take-back fails with it. */
    spoolFailure?: Error
    /** The run's start as agent-run said it before any command ran; else read from the volume's mark. */
    since?: string
    /** What the helper that lists them again runs as. */
    helper: HelperOptions
  },
): Promise<{received: number; settled: Promise<void>}> {
  // a host that could not hold the changes once would not the second time: not listed again
  if (!options.trailer && options.spoolFailure) {
    forgetVolume(state)
    throw notHeld(state.spoolDir, options.spoolFailure)
  }
  const trailer = options.trailer ?? (await listChangesAgain(cli, state, options))
  // where no boot id says which boot a record was written in, every write is durable before the reply
  const boot = thisBoot() ?? undefined
  let applied: Awaited<ReturnType<typeof applyChanges>>
  try {
    const present = await namesListed(trailer.list, state.synced)
    applied = await applyChanges(options.workspace, trailer.changes, present, state.synced, {
      ...options,
      ...(boot ? {durable: false as const} : {}),
    })
  } catch (error) {
    // part of the changes may be on the host, the rest only in the volume: no record says what it
    // holds now, so the next run there starts from the host's workspace whole
    forgetVolume(state)
    throw error
  } finally {
    trailer.close()
  }
  const {received, record, files, folders} = applied
  const snapshot = record ?? snapshotWorkspace(options.workspace)
  state.generation = options.runId
  // the record is what the push sent with what the run brought back, never a walk of the host now:
  // an edit made on the host while the run ran is unlike it, so the next push sends it
  if (!boot) {
    // each file was fsynced before its rename: its name, and every name made or removed, reach the
    // disk while the record is written, and the reply waits for both
    const durable = syncAside(options.workspace, folders, 'folder')
    durable.catch(() => {}) // awaited below, after the record's own error if it has one
    remember(state, snapshot)
    await durable
    return {received, settled: Promise.resolve()}
  }
  remember(state, snapshot, boot)
  const settled = (async () => {
    await syncAside(options.workspace, files, 'file')
    await syncAside(options.workspace, folders, 'folder')
    // a later message's record (or its forgetting) is never replaced by this one
    if (state.synced === snapshot) await writeWholeFileAside(state.file, recordText(state, snapshot))
  })()
  settled.catch(() => {}) // the caller's to report
  return {received, settled}
}

/**
 * Whether the host's file changed while the run ran: made, removed or rewritten since `synced`,
 * the host's state as the run's volume was brought to it (a SOUL.md saved in the dashboard).
 */
function changedOnHost(
  workspace: string,
  name: string,
  synced: Snapshot | undefined,
  // never through a link among its parents: what is beyond one is not the host's workspace
  now = lstatWorkspaceEntry(workspace, name),
): boolean {
  if (!synced) return false
  const before = synced[name]
  if (!now) return before !== undefined
  // FIFOs, sockets and devices are never synced: the run's entry replaces one (never written through)
  if (!now.isFile() && !now.isDirectory() && !now.isSymbolicLink()) return false
  if (!before) return true
  if (before[2] === 'd') return !now.isDirectory()
  const sameKind = before[2] === 'l' ? now.isSymbolicLink() : now.isFile()
  return !sameKind || before[0] !== now.size || before[1] !== now.mtimeMs
}

/** How many fsyncs run at once: each holds a descriptor, and a run may have made 100,000 folders. */
const SYNCS_AT_ONCE = 8

/**
 * fsyncs files or folders of the workspace on libuv's threads, the first ones started before it
 * returns, so this thread may write meanwhile; settles once each is on the disk. An entry gone
 * since (a later entry removed it) or no longer of its kind has nothing to keep; never a link
 * followed, never a FIFO waited on.
 */
export function syncAside(workspace: string, names: Iterable<string>, kind: 'file' | 'folder'): Promise<void> {
  const left = [...names]
  const flags =
    fs.constants.O_RDONLY |
    fs.constants.O_NOFOLLOW |
    (kind === 'folder' ? fs.constants.O_DIRECTORY : fs.constants.O_NONBLOCK)
  return new Promise<void>((resolve, reject) => {
    let running = 0
    let failed: {error: unknown} | undefined
    const next = () => {
      while (!failed && running < SYNCS_AT_ONCE && left.length > 0) {
        const name = left.shift()!
        // a file only where the writer left one, never below a link: opening a device may act on it
        if (kind === 'file' && !isWorkspaceFile(workspace, name)) continue
        let fd: number
        try {
          fd = fs.openSync(path.join(workspace, name), flags)
        } catch (error) {
          const code = (error as NodeJS.ErrnoException).code ?? ''
          if (!['ENOENT', 'ENOTDIR', 'ELOOP'].includes(code) && !folderSyncRefused(error)) failed = {error}
          continue
        }
        running++
        fs.fsync(fd, (error) => {
          fs.close(fd, () => {})
          running--
          if (error && !folderSyncRefused(error)) failed ??= {error}
          next()
        })
      }
      if (running === 0) {
        if (failed) reject(failed.error)
        else resolve()
      }
    }
    next()
  })
}

/** Whether `name` is a regular file of the workspace now; a workspace gone has none. */
function isWorkspaceFile(workspace: string, name: string): boolean {
  try {
    return lstatWorkspaceEntry(workspace, name)?.isFile() ?? false
  } catch {
    return false
  }
}

/**
 * Applies a run's change tar to the host workspace: files and folders through the no-follow
 * writer, symbolic links made where they were (makeWorkspaceSymlink), anything else logged and
 * skipped; names the host had (`synced`) that are not `present` in the volume any more are
 * removed. A file the host changed while the run ran keeps the host's version, logged (`kept`):
 * the host is the one truth, and a run whose mark shares a tick with the last run's writes (a
 * filesystem stamping whole seconds) lists those again though it never touched them.
 *
 * Returns how many files were written, the names kept, the folders whose entries changed (for
 * the caller to fsync: each file was), and `record`: `synced` brought to what
 * the volume now holds as far as the host knows it (undefined when `synced` was). A name written,
 * made or removed is recorded as the host has it after that step; a name the host kept, or whose
 * entry it could not take (a folder where the run made a file), as unlike anything, of the kind
 * the volume has there, with nothing recorded below it, so the next push replaces it in the volume
 * whole; any other name as it was, so a change the host made meanwhile still differs and is sent.
 *
 * Only the writer's deliberate refusals (WorkspaceRefusal) are logged and passed over; any other
 * failure to write or remove an entry (a full disk, a name too long for the host's filesystem, a
 * permission) throws E_WORKSPACE naming it: the run's changes did not all reach the host.
 */
export async function applyChanges(
  workspace: string,
  changes: ByteSource | Buffer,
  present: ReadonlySet<string | undefined>,
  synced: Snapshot | undefined,
  options: {
    maxBytes: number
    log: (line: string) => void
    /** false: the files are put in place before their bytes are on the disk (the caller fsyncs `files`). */
    durable?: false
  },
): Promise<{
  received: number
  kept: string[]
  record: Snapshot | undefined
  files: Set<string>
  folders: Set<string>
}> {
  const turn = eventLoopTurns()
  let received = 0
  const kept: string[] = []
  const record: Snapshot | undefined = synced && {...synced}
  /** Names the next push replaces whole: nothing below them is recorded (see the end). */
  const replaced = new Set<string>()
  /** The volume's `name` (of `kind`, or none) differs from the host's: the next push replaces it. */
  const unlike = (name: string, kind: 'f' | 'd' | 'l') => {
    if (!record) return
    record[name] = [-1, -1, kind]
    replaced.add(name)
  }
  const skip = (entry: TarHeaderEntry, why: string, kind?: 'f' | 'd' | 'l') => {
    // only over what the host had there: a name new to both is not the host's to send again
    const name = safeName(entry.name)
    if (kind && name && record && name in record) unlike(name, kind)
    options.log(`workspace sync: not brought back: ${JSON.stringify(entry.name)} ${why}`)
  }
  const keep = (name: string, kind: 'f' | 'd' | 'l') => {
    kept.push(name)
    unlike(name, kind)
    options.log(
      `workspace sync: the host's ${JSON.stringify(name)} stays as it is: it was changed or removed on the host during the run`,
    )
  }
  /** The folders whose entries it made, replaced or removed: each to be fsynced once (pullWorkspace). */
  const touched = new Set<string>()
  /** The files it wrote not yet on the disk (`durable: false`): the caller fsyncs them. */
  const filesWritten = new Set<string>()
  const changedIn = (name: string) => touched.add(path.dirname(name))
  /** The folders the writer makes on the way to `name` (an archive that did not list them) change their parents too. */
  const parentsMadeFor = (name: string) => {
    for (let dir = path.dirname(name); dir !== '.' && !lstatWorkspaceEntry(workspace, dir); dir = path.dirname(dir))
      changedIn(dir)
  }
  const archive = Buffer.isBuffer(changes) ? bufferSource(changes) : changes
  for (const entry of tarEntries(archive, options.maxBytes)) {
    await turn()
    const name = safeName(entry.name)
    if (!name) {
      skip(entry, 'is not a name inside the workspace')
      continue
    }
    // each step below checks every folder on the way: a deeper name costs the square of its depth
    if (depthOf(name) > MAX_SYNC_DEPTH) {
      skip(entry, `is more than ${MAX_SYNC_DEPTH} folders deep`)
      continue
    }
    const kind = TAR_KINDS[entry.type]
    try {
      if (entry.type === '5') {
        // a folder listed because its entries changed is not new in its own: those entries say so
        if (!lstatWorkspaceEntry(workspace, name)?.isDirectory()) changedIn(name)
        makeWorkspaceDirectory(workspace, name)
        if (record && record[name]?.[2] !== 'd') record[name] = [0, 0, 'd']
      } else if (kind && changedOnHost(workspace, name, synced)) keep(name, kind)
      else if (entry.type === '0') {
        const written = (stat: fs.Stats) => {
          if (record) record[name] = [stat.size, stat.mtimeMs, 'f']
        }
        parentsMadeFor(name)
        const content = archive.content(entry.dataAt, entry.size)
        // one its owner cannot read could not be opened again for the fsync: written durably now
        const later = options.durable === false && (entry.mode & 0o400) !== 0
        const writing = {mode: entry.mode & 0o777, written, ...(later ? {durable: false as const} : {})}
        // what came past memory (a spooled trailer) may be a GiB: written between the loop's turns,
        // the host's file checked again just before it is replaced
        const placed = Buffer.isBuffer(content)
          ? writeWorkspaceFile(workspace, name, content, writing)
          : await writeWorkspaceFileInTurns(workspace, name, content, {
              ...writing,
              turn,
              stillWanted: () => !changedOnHost(workspace, name, synced),
            })
        if (!placed) {
          keep(name, 'f')
          continue
        }
        changedIn(name)
        if (later) filesWritten.add(name)
        received++
      } else if (entry.type === '2' && GATEWAY_ENTRIES.includes(name))
        skip(entry, "is a link where the gateway keeps one of the agent's own files", 'l')
      else if (entry.type === '2') {
        parentsMadeFor(name)
        makeWorkspaceSymlink(workspace, name, entry.linkname ?? '')
        changedIn(name)
        const made = lstatWorkspaceEntry(workspace, name)
        if (record) record[name] = made?.isSymbolicLink() ? [made.size, made.mtimeMs, 'l'] : [-1, -1, 'l']
        received++
      } else skip(entry, `is not a regular file, folder or symbolic link (tar type ${entry.type})`)
    } catch (error) {
      // the writer's refusals are the host's rules (a folder where the run made a file, a link among
      // the parents): the host's entry stays. Anything else is the host failing to take the change
      if (!(error instanceof WorkspaceRefusal)) throw notTakenBack(name, 'written', error)
      skip(entry, error.message, kind)
    }
  }
  for (const name of Object.keys(synced ?? {})
    .sort()
    .reverse()) {
    if (present.has(name)) continue
    await turn()
    const onHost = lstatWorkspaceEntry(workspace, name)
    if (onHost && changedOnHost(workspace, name, synced, onHost)) keep(name, 'f')
    else
      try {
        // what it held that the run removed is gone by now (children come first): a folder that
        // still holds something stays, with what it holds, and the next push makes it again
        let stays = false
        if (synced![name]![2] !== 'd') removeWorkspaceEntry(workspace, name)
        else if ((stays = !removeEmptyWorkspaceDirectory(workspace, name)))
          options.log(
            `workspace sync: the host's ${JSON.stringify(name)} stays: it still holds something the run did not have (put there during the run, or never synced)`,
          )
        // its folder changed only when something was there and went
        if (onHost && !stays) changedIn(name)
        if (record) delete record[name]
      } catch (error) {
        if (!(error instanceof WorkspaceRefusal)) throw notTakenBack(name, 'removed', error)
        options.log(`workspace sync: not removed: ${JSON.stringify(name)} ${error.message}`)
      }
  }
  // once, whatever order the archive came in: one pass over the record, never one per name
  if (record && replaced.size > 0)
    for (const name of Object.keys(record)) if (belowAny(name, replaced)) delete record[name]
  return {received, kept, record, files: filesWritten, folders: touched}
}

/** The deepest name taken back: deeper ones (a hostile trailer's `a/a/a/…`) are logged and left. */
const MAX_SYNC_DEPTH = 256

function depthOf(name: string): number {
  let depth = 1
  for (let slash = name.indexOf('/'); slash !== -1; slash = name.indexOf('/', slash + 1)) depth++
  return depth
}

/** How long the take-back works on the event loop before it lets the gateway's other work run. */
const TURN_MS = 10

/**
 * `await turn()` between steps: every TURN_MS it waits for the event loop's next turn, so a trailer
 * that is slow to apply (many or deep names, one fsync each) never stalls other agents' replies,
 * timers and the dashboard.
 */
function eventLoopTurns(): () => Promise<void> {
  let since = performance.now()
  return async () => {
    if (performance.now() - since < TURN_MS) return
    await new Promise((resolve) => setImmediate(resolve))
    since = performance.now()
  }
}

/**
 * Which of the names the host synced (`synced`) a trailer's list says the volume still holds, read
 * in pieces and turns: the list may hold millions, and only those names are ever asked about.
 */
async function namesListed(list: ByteSource, synced: Snapshot | undefined): Promise<Set<string>> {
  const turn = eventLoopTurns()
  const names = new Set<string>()
  if (!synced) return names
  /** The start of a name the last piece cut. */
  let carried = Buffer.alloc(0)
  /** Within a "name" longer than any path: left, up to its end. */
  let skipping = false
  for (let at = 0; at < list.length;) {
    const read = list.read(at, LIST_PIECE_BYTES)
    if (read.length === 0) break
    at += read.length
    const last = at >= list.length
    const piece = carried.length > 0 ? Buffer.concat([carried, read]) : read
    let start = 0
    while (start < piece.length) {
      let end = piece.indexOf(0, start)
      if (end === -1 && !last) break
      if (end === -1) end = piece.length
      await turn()
      const name = skipping || end - start > MAX_NAME_BYTES ? undefined : safeName(piece.toString('utf8', start, end))
      if (name && Object.hasOwn(synced, name)) names.add(name)
      skipping = false
      start = end + 1
    }
    carried = start < piece.length ? Buffer.from(piece.subarray(start)) : Buffer.alloc(0)
    if (carried.length > MAX_NAME_BYTES) {
      carried = Buffer.alloc(0)
      skipping = true
    }
  }
  return names
}

/** Longer than any path a filesystem takes (PATH_MAX is 4096): not a name. */
const MAX_NAME_BYTES = 64 * 1024
/** How much of a spooled list is read at once. */
const LIST_PIECE_BYTES = 1 << 20

/** Why the host could not take a change, and what fixes it, by the system's error code. */
const HOST_FAILURES: Partial<Record<string, {why: string; fix: string}>> = {
  ENAMETOOLONG: {
    why: "the name is too long for the host's filesystem",
    fix: 'ask the agent for a shorter name, or keep the workspace on a filesystem that takes names of 255 bytes',
  },
  ENOSPC: {why: "the host's disk is full", fix: "free space on the disk that holds the agent's workspace"},
  EDQUOT: {
    why: "the gateway's user is over its disk quota",
    fix: "raise the disk quota of the gateway's user, or free space in it",
  },
  EACCES: {
    why: "the gateway's user may not write there",
    fix: "let the gateway's user write in the agent's workspace (owner and modes of its folders)",
  },
  EPERM: {
    why: "the gateway's user may not change it",
    fix: "let the gateway's user write in the agent's workspace (owner, modes and attributes of its entries)",
  },
  EROFS: {why: "the host's filesystem is read-only", fix: "mount the agents' folder writable"},
}

/**
 * A change of the run's that the host failed to write or remove (anything but the writer's
 * deliberate refusals): the take-back fails, so the message is never reported done with its
 * writes only in the engine's volume. The name is quoted (it is the agent's, and may hold anything);
 * the system's own message is not used, since it repeats the path unquoted.
 */
function notTakenBack(name: string, what: 'written' | 'removed', error: unknown): GatewayError {
  const {why, fix} = hostFailure(error)
  return new GatewayError('E_WORKSPACE', `${JSON.stringify(name)} could not be ${what} on the host: ${why}`, {
    cause: error,
    suggestions: [fix, SEND_AGAIN],
  })
}

/** The host could not hold a run's changes while taking them back (its spool's disk full). */
function notHeld(spoolDir: string, error: Error): GatewayError {
  const {why, fix} = hostFailure(error)
  return new GatewayError(
    'E_WORKSPACE',
    `the run's changes could not be held on the host while they were taken back (${spoolDir}): ${why}`,
    {
      cause: error,
      suggestions: [
        `a run's changes past what memory holds wait in ${spoolDir} while they are taken back: ${fix}`,
        SEND_AGAIN,
      ],
    },
  )
}

/** Why a write on the host failed, and its fix, by the system's error code (the message repeats the path unquoted). */
function hostFailure(error: unknown): {why: string; fix: string} {
  const code = (error as NodeJS.ErrnoException).code
  const known = code ? HOST_FAILURES[code] : undefined
  return {
    why: known ? `${known.why} (${code})` : code ? `error ${code}` : toGatewayError(error).message,
    fix: known?.fix ?? `fix the cause on the host (${code ?? 'see the message'})`,
  }
}

const SEND_AGAIN =
  "then send the message again: the engine's copy of the workspace is dropped, and the next run there starts from the host's"

/** Whether a folder above `name` is one of `folders`. */
function belowAny(name: string, folders: ReadonlySet<string>): boolean {
  for (let slash = name.indexOf('/'); slash !== -1; slash = name.indexOf('/', slash + 1))
    if (folders.has(name.slice(0, slash))) return true
  return false
}

/** The kind a snapshot records for a tar entry's type; none for what is never synced. */
const TAR_KINDS: Partial<Record<string, 'f' | 'd' | 'l'>> = {'0': 'f', '5': 'd', '2': 'l'}

/**
 * The run's list and change tar when its trailer did not arrive whole (the engine's connection
 * broke): listed again from the volume by a helper, since the mark this run's go line set, the
 * way its container would have; a volume whose mark another run set (this one never started) is refused.
 */
async function listChangesAgain(
  cli: DockerCli,
  state: SyncedVolume,
  options: {runId: string; pushed: boolean; maxBytes: number; helper: HelperOptions; since?: string},
): Promise<SyncTrailer> {
  const {image, uid, gid, labels, fsid} = options.helper
  const mark = `${CONTAINER_WORKSPACE}/${SYNC_DIR}/mark`
  const script = [
    volumeCheck(fsid),
    // the agent could have made the mark a FIFO or a huge sparse file: a regular file's first bytes only
    `[ -f ${mark} ] && [ ! -L ${mark} ] && run=$(head -c 256 ${mark}) && [ "$run" = "$1" ] || exit ${NO_MARK_EXIT}`,
    // the start agent-run said before any command of the agent ran; the mark's time only when it
    // said none (the agent could have moved the mark since)
    `since=$3`,
    `if [ -z "$since" ]; then since=$(date -r ${mark} +%s%N) && { [ "$2" = pushed ] || since=$((since - 1)); }; fi`,
    CHANGES_SINCE,
  ].join('\n')
  const child = cli.spawn(
    [
      ...helperArgs(state.volume, image, `${uid}:${gid}`, {...labels, [LABEL.run]: 'workspace-sync'}, {tmp: true}),
      '-c',
      script,
      'sh',
      syncToken(options.runId),
      options.pushed ? 'pushed' : 'clean',
      /^\d{1,20}$/.test(options.since ?? '') ? options.since! : '',
    ],
    {streamStdout: true, timeoutMs: 120_000},
  )
  const {frames, trailer, spoolFailure, overLimit} = splitSyncTrailer(child.stdout!, options.maxBytes, state.spoolDir)
  frames.resume()
  const [listed, result] = await Promise.all([trailer, child])
  // a whole tar from a walk that skipped something (a file it could not read) is not the changes
  if (listed && result.exitCode === 0) return listed
  listed?.close()
  const failure = spoolFailure()
  if (failure) throw notHeld(state.spoolDir, failure)
  // the run wrote past limits.disk and ended before a watch saw it: its agent-run's trailer stopped there too
  const over = overLimit()
  if (over !== undefined) throw new ChangesOverLimit(over)
  if (result.exitCode === NO_MARK_EXIT)
    throw new GatewayError('E_WORKSPACE', "the run's container left no list of its changes (it did not finish)")
  throw new GatewayError(
    'E_WORKSPACE',
    `could not list the run's changes on the engine (exit ${result.exitCode}): ${String(result.stderr).trim().split('\n').slice(-2).join('; ')}`,
  )
}

/** A run's changes are more than its limits.disk: it wrote past the limit (E_DISK, as a watch that saw it says). */
export class ChangesOverLimit extends GatewayError {
  constructor(readonly bytes: number) {
    super(
      'E_DISK',
      `the run's changes on the engine came to more than its limits.disk (${bytes} bytes when they were cut)`,
    )
    this.name = 'ChangesOverLimit'
  }
}

/** The exit status of a helper that found no mark of the run in the volume. */
const NO_MARK_EXIT = 97
