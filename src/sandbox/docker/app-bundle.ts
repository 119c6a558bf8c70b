import fs from 'node:fs'
import os from 'node:os'
import path from 'node:path'
import {AGENT_RUN_FILES} from '../../runtime/agent-run/bundle.js'
import {GatewayError} from '../../runtime/util/errors.js'
import {helperPath} from '../landlock/helper-path.js'
import {sha256Hash} from './dockerfile.js'

/**
 * The meepagateway runtime that goes into an isolation image: the host's Node binary and what
 * starts agent-run (its bundle, the packages it loads from node_modules, the sandbox helper), not
 * the rest of the app: a container runs nothing else, and what is not there cannot be used from
 * inside. better-sqlite3 is a native addon built for this host's libc and architecture, which is
 * why the base must match them.
 */
export interface AppBundleSource {
  /** The installed app's root (holds bin/, dist/, package.json, node_modules/). */
  appRoot: string
  /** The Node executable to copy (the host's process.execPath). */
  nodePath: string
}

export interface AppBundleContext {
  dir: string
  files: number
  bytes: number
  remove(): Promise<void>
}

/** The app's files in the image, relative to its root: agent-run's, and the sandbox helper. */
function runtimeEntries(appRoot: string): string[] {
  return [...Object.values(AGENT_RUN_FILES), path.relative(appRoot, path.dirname(helperPath(appRoot)))]
}
/** Never part of the runtime: VCS data, and native build intermediates (only the .node files are loaded). */
const SKIP_NAMES = new Set(['.git', '.github', '.bin', '.cache', 'obj', 'obj.target', '.deps'])
/** Files of dependencies nothing loads at run time: type declarations, source maps, static libraries, docs. */
const SKIP_DEPENDENCY_FILE = /(\.d\.[cm]?ts|\.map|\.[ao]|\.md|\.markdown)$/i

/**
 * A hash of everything the bundle would contain, cheap enough to compute for every `send` and
 * `container build`: the Node binary by version, size and mtime, the app's files by content (the
 * build's record of that digest while every file is as the build left it), and each package by
 * its package.json (name and version; an installed package does not change without a new version).
 */
export async function computeAppHash(source: AppBundleSource): Promise<string> {
  assertBuilt(source.appRoot)
  // read synchronously: a few small files, which the thread pool would only make slower
  const [node, filesDigest, manifests] = [
    fs.statSync(source.nodePath),
    await runtimeFilesDigest(source.appRoot),
    runtimePackageManifests(source.appRoot),
  ]
  const hash = sha256Hash()
  hash.update(`node ${process.version} ${process.arch} ${node.size} ${node.mtimeMs}\n`)
  hash.update(`app ${filesDigest}\n`)
  for (const {pkg, manifest} of manifests) {
    hash.update(`${pkg}\n`)
    hash.update(manifest)
  }
  return hash.digest('hex').slice(0, 16)
}

/** Each runtime package with its package.json, in the recorded order. */
function runtimePackageManifests(appRoot: string): Array<{pkg: string; manifest: Buffer}> {
  return runtimePackages(appRoot).map((pkg) => ({
    pkg,
    manifest: fs.readFileSync(path.join(appRoot, pkg, 'package.json')),
  }))
}

/**
 * Written by the build (scripts/record-app-digest.js): the app files' digest with the size and
 * mtime of each file it read.
 */
export const APP_DIGEST_RECORD = 'dist/app-digest.json'

interface AppDigestRecord {
  digest: string
  files: FileStamp[]
}

/** A file as the digest saw it; any rewrite (a build, an edit) changes its mtime. */
interface FileStamp {
  file: string
  size: number
  mtimeMs: number
}

/**
 * The digest of the app's runtime files: the build's record while every file matches it, else read
 * and hashed (≈ 5–15 ms).
 */
async function runtimeFilesDigest(appRoot: string): Promise<string> {
  const [stamps, record] = [runtimeFileStamps(appRoot), readAppDigestRecord(appRoot)]
  if (record && sameStamps(record.files, stamps)) return record.digest
  return digestFiles(appRoot, stamps)
}

/**
 * Records the digest for runtimeFilesDigest; stamps are taken before reading, so a file changed
 * meanwhile never matches.
 */
export async function recordAppDigest(appRoot: string): Promise<void> {
  const files = runtimeFileStamps(appRoot)
  const record: AppDigestRecord = {digest: await digestFiles(appRoot, files), files}
  await fs.promises.writeFile(path.join(appRoot, APP_DIGEST_RECORD), `${JSON.stringify(record, null, 2)}\n`)
}

function runtimeFileStamps(appRoot: string): FileStamp[] {
  return runtimeEntries(appRoot).flatMap((entry) => stampFiles(path.join(appRoot, entry), entry))
}

async function digestFiles(appRoot: string, stamps: FileStamp[]): Promise<string> {
  const hash = sha256Hash()
  for (const {file} of stamps) {
    hash.update(`${file}\n`)
    // V8 writes a different cache on every build; it follows from the bundle and Node, both hashed.
    if (file !== AGENT_RUN_FILES.codeCache) hash.update(await fs.promises.readFile(path.join(appRoot, file)))
  }
  return hash.digest('hex')
}

function readAppDigestRecord(appRoot: string): AppDigestRecord | undefined {
  try {
    return JSON.parse(fs.readFileSync(path.join(appRoot, APP_DIGEST_RECORD), 'utf8')) as AppDigestRecord
  } catch {
    return undefined // not built with the record, or unreadable: the files are hashed
  }
}

/**
 * Same files in the same order, each of the same size and mtime (the code cache's content is not
 * hashed, so its stamp does not count).
 */
function sameStamps(recorded: FileStamp[], current: FileStamp[]): boolean {
  return (
    recorded.length === current.length &&
    recorded.every((stamp, i) => {
      const now = current[i]!
      return (
        stamp.file === now.file &&
        (stamp.file === AGENT_RUN_FILES.codeCache || (stamp.size === now.size && stamp.mtimeMs === now.mtimeMs))
      )
    })
  )
}

/**
 * Assembles the isolation image's build context in a temp dir: `node/node`, `deps/node_modules`
 * (production packages only) and `app/`. Files are hard-linked (copied across file systems), so
 * assembling takes well under a second even for a large node_modules.
 */
export async function assembleAppBundle(source: AppBundleSource, dockerfile: string): Promise<AppBundleContext> {
  assertBuilt(source.appRoot)
  const dir = await fs.promises.mkdtemp(path.join(os.tmpdir(), 'meepa-isolation-'))
  const counter = {files: 0, bytes: 0}
  try {
    await fs.promises.mkdir(path.join(dir, 'node'))
    await placeFile(source.nodePath, path.join(dir, 'node', 'node'), counter)
    for (const entry of runtimeEntries(source.appRoot))
      await placeTree(path.join(source.appRoot, entry), path.join(dir, 'app', entry), counter)
    for (const pkg of runtimePackages(source.appRoot)) {
      await placeTree(path.join(source.appRoot, pkg), path.join(dir, 'deps', pkg), counter, {dependency: true})
    }
    await fs.promises.mkdir(path.join(dir, 'deps'), {recursive: true})
    await fs.promises.writeFile(path.join(dir, 'Dockerfile'), dockerfile)
  } catch (error) {
    await fs.promises.rm(dir, {recursive: true, force: true})
    throw error
  }
  return {dir, ...counter, remove: () => fs.promises.rm(dir, {recursive: true, force: true})}
}

/** node_modules paths (relative to the app root) of the packages agent-run loads, as the build recorded them. */
function runtimePackages(appRoot: string): string[] {
  return JSON.parse(fs.readFileSync(path.join(appRoot, AGENT_RUN_FILES.packages), 'utf8')) as string[]
}

function assertBuilt(appRoot: string): void {
  if (!fs.existsSync(path.join(appRoot, AGENT_RUN_FILES.packages))) {
    throw new GatewayError(
      'E_IMAGE',
      `the app at ${appRoot} is not built (no ${AGENT_RUN_FILES.packages}), so it cannot be put into the isolation image`,
      {
        suggestions: [`run npm run build in ${appRoot}`],
      },
    )
  }
}

/**
 * Copies a tree into the context. For a dependency (`dependency: true`) its own node_modules is
 * skipped (nested packages are lockfile entries of their own), as are files nothing loads and,
 * for a native addon (binding.gyp), the vendored C sources in deps/.
 */
async function placeTree(
  from: string,
  to: string,
  counter: {files: number; bytes: number},
  options: {dependency?: boolean; below?: boolean} = {},
): Promise<void> {
  const info = await fs.promises.stat(from).catch(() => undefined)
  if (!info) return
  if (!info.isDirectory()) {
    await fs.promises.mkdir(path.dirname(to), {recursive: true})
    await placeFile(from, to, counter)
    return
  }
  await fs.promises.mkdir(to, {recursive: true})
  const entries = await fs.promises.readdir(from, {withFileTypes: true})
  const nativeAddon =
    options.dependency === true && !options.below && entries.some((entry) => entry.name === 'binding.gyp')
  for (const entry of entries) {
    if (SKIP_NAMES.has(entry.name)) continue
    if (options.dependency && entry.name === 'node_modules') continue
    if (nativeAddon && entry.isDirectory() && entry.name === 'deps') continue
    if (options.dependency && entry.isFile() && SKIP_DEPENDENCY_FILE.test(entry.name)) continue
    const source = path.join(from, entry.name)
    const target = path.join(to, entry.name)
    if (entry.isDirectory()) await placeTree(source, target, counter, {dependency: options.dependency, below: true})
    else if (entry.isSymbolicLink()) await fs.promises.symlink(await fs.promises.readlink(source), target)
    else if (entry.isFile()) await placeFile(source, target, counter)
  }
}

async function placeFile(from: string, to: string, counter: {files: number; bytes: number}): Promise<void> {
  try {
    await fs.promises.link(from, to)
  } catch {
    await fs.promises.copyFile(from, to, fs.constants.COPYFILE_FICLONE)
  }
  counter.files++
  counter.bytes += (await fs.promises.stat(from)).size
}

/** The files at or under `dir` (relative paths, sorted so the hash is stable), each stamped as it is now. */
function stampFiles(dir: string, relative: string): FileStamp[] {
  let info: fs.Stats
  try {
    info = fs.statSync(dir)
  } catch {
    return [] // not there (or not readable): not in the image either
  }
  if (!info.isDirectory()) return [{file: relative, size: info.size, mtimeMs: info.mtimeMs}]
  const entries = fs
    .readdirSync(dir, {withFileTypes: true})
    .filter((entry) => !SKIP_NAMES.has(entry.name) && (entry.isDirectory() || entry.isFile()))
    .sort((a, b) => (a.name < b.name ? -1 : 1))
  return entries.flatMap((entry) => stampFiles(path.join(dir, entry.name), `${relative}/${entry.name}`))
}
