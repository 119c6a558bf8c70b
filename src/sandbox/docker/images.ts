import fs from 'node:fs'
import path from 'node:path'
import type {AgentConfig, GatewayConfig} from '../../runtime/config/types.js'
import {GatewayError} from '../../runtime/util/errors.js'
import {KeyedQueue} from '../../runtime/util/keyed-queue.js'
import {assembleAppBundle, computeAppHash, type AppBundleSource} from './app-bundle.js'
import type {DockerExec} from './cli.js'
import {
  CONTAINER_APP,
  CONTAINER_NODE,
  LABEL,
  generateContainerDockerfile,
  generateIsolationDockerfile,
  isolationImageTag,
  validateImageRef,
  type ContainerImageSpec,
  type GeneratedDockerfile,
  type PackageManager,
} from './dockerfile.js'
import {dockerArchOf, readElfRuntime} from './elf.js'
import {EngineApi} from './engine-api.js'
import {cliRefusal, DockerCommandError} from './errors.js'
import {makeDirectories} from '../../runtime/util/make-directories.js'

/**
 * The image pipeline of container mode: which images an agent needs, whether they are up to
 * date, and building them (each at most once at a time, progress through `onLog`).
 */

export interface ImageInfo {
  id: string
  tags: string[]
  arch: string
  os: string
  size: number
  created: string
  env: string[]
  labels: Record<string, string>
}

export interface ImageContext {
  cli: DockerExec
  /** The engine's API on its local socket: images are then inspected without a docker process. */
  engine?: EngineApi
  /** The runtime that goes into isolation images. */
  app: AppBundleSource
  /** The app's version (package.json), part of the isolation tag. */
  version: string
  /** Directory for small caches (what each base image is); nothing is cached on disk without it. */
  cacheDir?: string
  signal?: AbortSignal
  onLog?: (line: string) => void
  /** Network for `docker build` (apt-get/apk inside the build must reach a mirror). */
  buildNetwork?: string
  /**
   * A rebuild removes the image its tag pointed to before this long after, not at once: messages
   * handed that image by an earlier check may still be about to start from it.
   */
  removeReplacedAfterMs?: number
}

/** Where the isolation image's base comes from, strongest first. */
export type IsolationBaseSource =
  'container_mode.image' | 'image_config.image' | 'image_config' | 'image_config.base_image'

export interface ImagePlan {
  agentId?: string
  source: IsolationBaseSource
  /** The image the isolation image is built from. */
  baseRef: string
  /** The container image to build from image_config (source 'image_config' only). */
  container?: GeneratedDockerfile & {spec: ContainerImageSpec}
  isolationTag: string
}

export const BUILD_TIMEOUT_MS = 30 * 60_000
const PROBE_TIMEOUT_MS = 60_000

/** One build per tag at a time in this process; builds of different tags may overlap. */
const builds = new KeyedQueue({concurrency: 2})

export async function inspectImage(cli: DockerExec, ref: string, signal?: AbortSignal): Promise<ImageInfo | undefined> {
  validateImageRef(ref, 'image') // before docker sees it: a reference is never a flag
  const result = await cli.exec(['image', 'inspect', '--format', '{{json .}}', ref], {signal})
  if (result.exitCode !== 0) {
    if (/no such image/i.test(result.stderr)) return undefined
    throw new DockerCommandError(['image', 'inspect', ref], result)
  }
  return imageInfoOf(JSON.parse(result.stdout) as RawImage)
}

/**
 * Several images in one docker process (each start of the docker CLI costs tens of ms of CPU).
 * docker prints the images it found in argument order; when one is missing (or anything else
 * differs) the lines cannot be matched to refs, so each is asked alone.
 */
export async function inspectImages(
  cli: DockerExec,
  refs: string[],
  signal?: AbortSignal,
): Promise<Array<ImageInfo | undefined>> {
  for (const ref of refs) validateImageRef(ref, 'image')
  if (refs.length > 1 && new Set(refs).size === refs.length) {
    const result = await cli.exec(['image', 'inspect', '--format', '{{json .}}', ...refs], {signal})
    const lines = result.stdout.split('\n').filter((line) => line.trim() !== '')
    if (result.exitCode === 0 && lines.length === refs.length)
      return lines.map((line) => imageInfoOf(JSON.parse(line) as RawImage))
  }
  return Promise.all(refs.map((ref) => inspectImage(cli, ref, signal)))
}

/** Several images, over the Engine API when the context has it (no docker process), else through the CLI. */
async function inspectImagesIn(context: ImageContext, refs: string[]): Promise<Array<ImageInfo | undefined>> {
  const engine = context.engine
  if (!engine) return inspectImages(context.cli, refs, context.signal)
  for (const ref of refs) validateImageRef(ref, 'image') // a reference is part of the request path
  return Promise.all(
    refs.map(async (ref) => {
      const raw = await engine.inspectImage(ref, {signal: context.signal})
      return raw && imageInfoOf(raw)
    }),
  )
}

/**
 * Every image carrying all of these labels: over the Engine API when given (no docker process per
 * image), else through the CLI.
 */
export async function labelledImages(
  docker: DockerExec | EngineApi,
  labels: string[],
  signal?: AbortSignal,
): Promise<ImageInfo[]> {
  if (docker instanceof EngineApi) return (await docker.images(labels, {signal})).map(imageInfoOf)
  const args = ['image', 'ls', '--quiet', '--no-trunc', ...labels.flatMap((label) => ['--filter', `label=${label}`])]
  const listed = await docker.exec(args, {signal})
  if (listed.exitCode !== 0) throw new DockerCommandError(args, listed)
  const ids = [...new Set(listed.stdout.split('\n').filter(Boolean))]
  // one removed between the list and its inspect is skipped, as over the API
  return (await inspectImages(docker, ids, signal)).filter((image): image is ImageInfo => image !== undefined)
}

/**
 * `docker image rm REF`: undefined when it is removed or was gone already, else why docker refused
 * (a container uses it...).
 */
export async function removeImage(
  docker: DockerExec | EngineApi,
  ref: string,
  signal?: AbortSignal,
): Promise<string | undefined> {
  validateImageRef(ref, 'image') // a reference is never a flag, nor more than one segment of a request path
  if (docker instanceof EngineApi) return docker.removeImage(ref, {signal})
  const removal = await docker.exec(['image', 'rm', ref], {signal})
  if (removal.exitCode === 0 || /no such image/i.test(removal.stderr)) return undefined
  return cliRefusal(removal.stderr)
}

/** What `docker image inspect` (and the Engine API's /images/{name}/json) says of an image, as far as it is read. */
export interface RawImage {
  Id: string
  RepoTags?: string[]
  Architecture?: string
  Os?: string
  Size?: number
  Created?: string
  Config?: {Env?: string[] | null; Labels?: Record<string, string> | null} | null
}

function imageInfoOf(raw: RawImage): ImageInfo {
  return {
    id: raw.Id,
    tags: raw.RepoTags ?? [],
    arch: raw.Architecture ?? 'unknown',
    os: raw.Os ?? 'unknown',
    size: raw.Size ?? 0,
    created: raw.Created ?? '',
    env: raw.Config?.Env ?? [],
    labels: raw.Config?.Labels ?? {},
  }
}

/** Which images an agent's container runs need (no building; may probe a base image once). */
export async function planImages(
  config: GatewayConfig,
  agent: AgentConfig | undefined,
  context: ImageContext,
): Promise<ImagePlan> {
  const imageConfig = config.image_config
  const agentImage = agent?.container_mode.image.trim()
  const base = (source: IsolationBaseSource, baseRef: string): ImagePlan => {
    validateImageRef(baseRef, source)
    return {agentId: agent?.id, source, baseRef, isolationTag: isolationImageTag(context.version, baseRef)}
  }
  if (agentImage) return base('container_mode.image', agentImage)
  if (!imageConfig.enabled) return base('image_config.base_image', imageConfig.base_image)
  if (imageConfig.image.trim()) return base('image_config.image', imageConfig.image.trim())

  const spec: ContainerImageSpec = {
    baseImage: imageConfig.base_image,
    packages: imageConfig.packages,
    envVars: imageConfig.env_vars,
  }
  if (spec.packages.length > 0) spec.packageManager = await detectPackageManager(spec.baseImage, context)
  const container = {...generateContainerDockerfile(spec), spec}
  return {
    agentId: agent?.id,
    source: 'image_config',
    baseRef: container.tag,
    container,
    isolationTag: isolationImageTag(context.version, container.tag),
  }
}

export interface EnsureResult {
  tag: string
  built: boolean
  /** Why it was (re)built, or 'up to date'. */
  reason: string
  id: string
}

/** Builds the container image of a plan unless an image with its tag exists (the tag is the content hash). */
export async function ensureContainerImage(
  plan: ImagePlan,
  context: ImageContext,
  options: {force?: boolean} = {},
): Promise<EnsureResult | undefined> {
  const container = plan.container
  if (!container) return undefined
  return builds.run(container.tag, async () => {
    const existing = await inspectImage(context.cli, container.tag, context.signal)
    if (existing && !options.force) return {tag: container.tag, built: false, reason: 'up to date', id: existing.id}
    await requireBase(context, container.spec.baseImage, 'image_config.base_image')
    context.onLog?.(
      `building container image ${container.tag} from ${container.spec.baseImage}${container.spec.packages.length ? ` with ${container.spec.packages.join(', ')}` : ''}`,
    )
    await dockerBuild(context, ['--network', context.buildNetwork ?? 'host', '-t', container.tag, '-'], {
      input: container.dockerfile,
    })
    const built = await inspectImage(context.cli, container.tag, context.signal)
    if (!built) throw new GatewayError('E_IMAGE', `docker build reported success but ${container.tag} does not exist`)
    return {tag: container.tag, built: true, reason: existing ? 'forced' : 'missing', id: built.id}
  })
}

/**
 * Builds the isolation image of a plan when it is missing, its base changed (label with the base
 * image ID) or the runtime changed (label with the app hash). Before building, checks that the
 * host's Node can run on the base at all (architecture, libc); after building, runs Node with
 * better-sqlite3 inside once, so a mismatch is reported here and never as a failed message.
 */
export async function ensureIsolationImage(
  plan: ImagePlan,
  context: ImageContext,
  options: {force?: boolean; appHash?: string} = {},
): Promise<EnsureResult> {
  return builds.run(plan.isolationTag, async () => {
    const {base, existing, appHash, stale} = await isolationImageState(plan, context, options.appHash)
    if (!base) throw missingBase(plan)
    const reason = stale ?? (options.force ? 'forced' : undefined)
    if (!reason) return {tag: plan.isolationTag, built: false, reason: 'up to date', id: existing!.id}

    await checkRuntimeFitsBase(plan.baseRef, base, context)
    context.onLog?.(`building isolation image ${plan.isolationTag} from ${plan.baseRef} (${reason})`)
    const basePath = base.env.find((entry) => entry.startsWith('PATH='))?.slice(5)
    const dockerfile = generateIsolationDockerfile({
      baseRef: plan.baseRef,
      baseId: base.id,
      basePath,
      appHash,
      version: context.version,
    })
    const bundle = await assembleAppBundle(context.app, dockerfile)
    try {
      context.onLog?.(`sending ${bundle.files} files (${Math.round(bundle.bytes / 1e6)} MB) to the engine`)
      await dockerBuild(context, ['--network', 'none', '-t', plan.isolationTag, bundle.dir])
    } finally {
      await bundle.remove()
    }
    const built = await inspectImage(context.cli, plan.isolationTag, context.signal)
    if (!built)
      throw new GatewayError('E_IMAGE', `docker build reported success but ${plan.isolationTag} does not exist`)
    await smokeTestIsolationImage(plan, context)
    // The image the tag pointed to before is now untagged; without this every upgrade would leave
    // one behind. Docker refuses (and we ignore) while a container still runs from it.
    if (existing && existing.id !== built.id) {
      const remove = (signal?: AbortSignal) =>
        context.cli.exec(['image', 'rm', existing.id], {signal}).catch(() => undefined)
      if (context.removeReplacedAfterMs) setTimeout(remove, context.removeReplacedAfterMs).unref()
      else await remove(context.signal)
    }
    return {tag: plan.isolationTag, built: true, reason, id: built.id}
  })
}

export interface IsolationImageState {
  base?: ImageInfo
  existing?: ImageInfo
  appHash: string
  /** Why the image must be (re)built; undefined when it is up to date. */
  stale?: string
}

/** Whether the isolation image exists and was built from the current base and runtime. */
export async function isolationImageState(
  plan: ImagePlan,
  context: ImageContext,
  appHash?: string,
): Promise<IsolationImageState> {
  const [[base, existing], hash] = await Promise.all([
    inspectImagesIn(context, [plan.baseRef, plan.isolationTag]),
    appHash ?? computeAppHash(context.app),
  ])
  const stale = !base
    ? 'base image missing'
    : !existing
      ? 'missing'
      : existing.labels[LABEL.baseId] !== base.id
        ? 'base image changed'
        : existing.labels[LABEL.appHash] !== hash
          ? 'meepagateway runtime changed'
          : undefined
  return {base, existing, appHash: hash, stale}
}

async function dockerBuild(context: ImageContext, args: string[], options: {input?: string} = {}): Promise<void> {
  const result = await context.cli.exec(['build', '--force-rm', ...args], {
    timeoutMs: BUILD_TIMEOUT_MS,
    signal: context.signal,
    input: options.input,
    onLine: (line) => {
      if (!isBuilderNoise(line)) context.onLog?.(line)
    },
  })
  if (result.exitCode !== 0) {
    throw new GatewayError('E_IMAGE', `docker build failed: ${tail(result.stderr || result.stdout, 8)}`, {
      details: {stderr_tail: (result.stderr || result.stdout).slice(-4096)},
      suggestions: [
        'check the package names in image_config.packages exist for the base image',
        'check the build machine can reach the distribution mirror',
      ],
    })
  }
}

/** The legacy builder's deprecation banner is printed on every build and says nothing about ours. */
function isBuilderNoise(line: string): boolean {
  return /legacy builder is deprecated|Install the buildx component|docs\.docker\.com\/go\/buildx/i.test(line)
}

/** Arch and libc of the host's Node against the base, before anything is built or run. */
export async function checkRuntimeFitsBase(baseRef: string, base: ImageInfo, context: ImageContext): Promise<void> {
  const runtime = await readElfRuntime(context.app.nodePath)
  if (!runtime) {
    throw new GatewayError(
      'E_IMAGE',
      `this gateway's Node (${context.app.nodePath}) is not a Linux executable, so it cannot run inside a Linux container`,
      {
        suggestions: [
          'run the gateway on a Linux host for container mode',
          'or use the host sandbox (container_mode.enabled: false)',
        ],
      },
    )
  }
  if (base.os !== 'linux' || base.arch !== runtime.arch || runtime.arch !== dockerArchOf(process.arch)) {
    throw new GatewayError(
      'E_IMAGE',
      `${baseRef} is built for ${base.os}/${base.arch} but this gateway's Node is linux/${runtime.arch}: it would fail with "exec format error"`,
      {
        details: {base_arch: base.arch, base_os: base.os, runtime_arch: runtime.arch},
        suggestions: [
          `use a linux/${runtime.arch} variant of the base: docker pull --platform linux/${runtime.arch} ${baseRef}`,
          `or run the gateway on a ${base.arch} host`,
        ],
      },
    )
  }
  if (!runtime.interpreter) return
  // The interpreter is glibc's (or musl's) dynamic loader: running it proves the base has that libc.
  const probe = await context.cli.exec(
    [
      'run',
      '--rm',
      '--pull',
      'never',
      '--network',
      'none',
      '--log-driver',
      'none',
      '--label',
      `${LABEL.gateway}=1`,
      '--entrypoint',
      runtime.interpreter,
      baseRef,
      '--version',
    ],
    {timeoutMs: PROBE_TIMEOUT_MS, signal: context.signal},
  )
  if (
    probe.exitCode === 126 ||
    probe.exitCode === 127 ||
    /no such file or directory|exec format error|not found/i.test(probe.stderr)
  ) {
    throw new GatewayError(
      'E_IMAGE',
      `${baseRef} has no ${runtime.interpreter}: its C library is not the ${runtime.libc} this gateway's Node and better-sqlite3 were built for (Alpine uses musl)`,
      {
        details: {interpreter: runtime.interpreter, libc: runtime.libc, stderr_tail: probe.stderr.slice(-2048)},
        suggestions: [
          'use a glibc base image such as debian:bookworm-slim or ubuntu:24.04 for image_config.base_image',
          'gcompat on Alpine is not enough for the native better-sqlite3 addon',
        ],
      },
    )
  }
}

async function smokeTestIsolationImage(plan: ImagePlan, context: ImageContext): Promise<void> {
  const probe = await context.cli.exec(
    [
      'run',
      '--rm',
      '--pull',
      'never',
      '--network',
      'none',
      '--log-driver',
      'none',
      '--read-only',
      '--cap-drop',
      'ALL',
      '--label',
      `${LABEL.gateway}=1`,
      '-w',
      CONTAINER_APP,
      '--entrypoint',
      CONTAINER_NODE,
      plan.isolationTag,
      // as agent-run loads it (by path, src/runtime/util/sqlite.ts): a libc or architecture mismatch fails here
      '-e',
      "process.dlopen({exports: {}}, require('path').resolve('node_modules/better-sqlite3/build/Release/better_sqlite3.node'))",
    ],
    {timeoutMs: PROBE_TIMEOUT_MS, signal: context.signal},
  )
  if (probe.exitCode === 0) return
  await context.cli.exec(['image', 'rm', '--force', plan.isolationTag], {signal: context.signal}).catch(() => undefined)
  const missingLibrary = /error while loading shared libraries: ([^:]+)/.exec(probe.stderr)?.[1]
  throw new GatewayError(
    'E_IMAGE',
    missingLibrary
      ? `Node cannot start on ${plan.baseRef}: the base lacks ${missingLibrary}`
      : `Node with better-sqlite3 does not start on ${plan.baseRef}: ${tail(probe.stderr, 3)}`,
    {
      details: {stderr_tail: probe.stderr.slice(-2048)},
      suggestions: missingLibrary
        ? [
            `add the package that provides ${missingLibrary} to image_config.packages (Debian: libstdc++6 for libstdc++.so.6)`,
            'or use debian:bookworm-slim as the base',
          ]
        : ['use debian:bookworm-slim (or another glibc base of the same architecture) as the base'],
    },
  )
}

function missingBase(plan: ImagePlan): GatewayError {
  if (plan.container) {
    return new GatewayError('E_IMAGE', `the container image ${plan.baseRef} has not been built yet`, {
      suggestions: ['run meepagateway container build'],
    })
  }
  return new GatewayError(
    'E_IMAGE',
    `the image ${plan.baseRef} (from ${plan.source}) is not on this machine, and images are never pulled implicitly`,
    {
      suggestions: [`docker pull ${plan.baseRef}`, `or set ${plan.source} to an image that exists (docker image ls)`],
    },
  )
}

async function requireBase(context: ImageContext, ref: string, where: string): Promise<ImageInfo> {
  const [info] = await inspectImagesIn(context, [ref])
  if (!info) {
    throw new GatewayError(
      'E_IMAGE',
      `the base image ${ref} (${where}) is not on this machine, and images are never pulled implicitly`,
      {
        suggestions: [`docker pull ${ref}`, `or set ${where} to an image that exists (docker image ls)`],
      },
    )
  }
  return info
}

/**
 * apt or apk, found by looking inside the base once; remembered by image ID (in memory and in
 * cacheDir) so a second `container build` does not start a container.
 */
export async function detectPackageManager(baseRef: string, context: ImageContext): Promise<PackageManager | null> {
  validateImageRef(baseRef, 'image_config.base_image')
  const base = await requireBase(context, baseRef, 'image_config.base_image')
  const cache = await readFactsCache(context.cacheDir)
  const known = cache[base.id]
  if (known && 'package_manager' in known) return known.package_manager
  const probe = await context.cli.exec(
    [
      'run',
      '--rm',
      '--pull',
      'never',
      '--network',
      'none',
      '--log-driver',
      'none',
      '--label',
      `${LABEL.gateway}=1`,
      '--entrypoint',
      '/bin/sh',
      baseRef,
      '-c',
      'if command -v apt-get >/dev/null 2>&1; then echo apt; elif command -v apk >/dev/null 2>&1; then echo apk; else echo none; fi',
    ],
    {timeoutMs: PROBE_TIMEOUT_MS, signal: context.signal},
  )
  const answer = probe.stdout.trim()
  const manager: PackageManager | null = answer === 'apt' || answer === 'apk' ? answer : null
  cache[base.id] = {package_manager: manager}
  await writeFactsCache(context.cacheDir, cache)
  return manager
}

type FactsCache = Record<string, {package_manager: PackageManager | null}>
const memoryFacts: FactsCache = {}

async function readFactsCache(cacheDir: string | undefined): Promise<FactsCache> {
  if (!cacheDir) return memoryFacts
  try {
    return {
      ...(JSON.parse(await fs.promises.readFile(path.join(cacheDir, 'docker-base-images.json'), 'utf8')) as FactsCache),
      ...memoryFacts,
    }
  } catch {
    return memoryFacts
  }
}

async function writeFactsCache(cacheDir: string | undefined, cache: FactsCache): Promise<void> {
  Object.assign(memoryFacts, cache)
  if (!cacheDir) return
  makeDirectories(cacheDir, 0o700)
  const file = path.join(cacheDir, 'docker-base-images.json')
  const temp = `${file}.${process.pid}.tmp`
  await fs.promises.writeFile(temp, JSON.stringify(cache, null, 2) + '\n')
  await fs.promises.rename(temp, file)
}

function tail(text: string, lines: number): string {
  return text.trim().split('\n').slice(-lines).join(' | ') || '(no output)'
}
