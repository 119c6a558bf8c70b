import fs from 'node:fs'
import Module, {createRequire} from 'node:module'
import path from 'node:path'
import vm from 'node:vm'
import {APP_ROOT} from '../util/app-root.js'

/**
 * agent-run as one bundled file (scripts/bundle-agent-run.js) loaded with V8's code cache: it
 * starts once per message, and compiling ~2 MB of JavaScript from scratch costs it ~20 ms more
 * than reading the cached bytecode. A cache V8 rejects (another Node build) only costs that time.
 */

/**
 * What starts agent-run, relative to the app root: all an isolation image needs of the app
 * besides the packages in `packages` (and the sandbox helper).
 */
export const AGENT_RUN_FILES = {
  bundle: 'dist/agent-run.cjs',
  codeCache: 'dist/agent-run.cjs.v8cache',
  /** The node_modules packages agent-run loads at run time (its externals and theirs), recorded at build time. */
  packages: 'dist/agent-run.packages.json',
  loader: 'dist/runtime/agent-run/bundle.js',
  /** The loader's one import besides Node's own. */
  appRoot: 'dist/runtime/util/app-root.js',
  entry: 'bin/run.js',
  /** Makes bin/run.js CommonJS (the app's package.json says ES modules). */
  entryType: 'bin/package.json',
  manifest: 'package.json',
}
/** Left out of the bundle: a native addon is found next to its package. */
export const AGENT_RUN_EXTERNALS = ['better-sqlite3']

export const AGENT_RUN_BUNDLE = path.join(APP_ROOT, AGENT_RUN_FILES.bundle)
const AGENT_RUN_CODE_CACHE = path.join(APP_ROOT, AGENT_RUN_FILES.codeCache)

interface AgentRunModule {
  main(): Promise<void>
}

function compile(cachedData: Buffer | undefined): {script: vm.Script; run(): AgentRunModule} {
  const script = new vm.Script(Module.wrap(fs.readFileSync(AGENT_RUN_BUNDLE, 'utf8')), {filename: AGENT_RUN_BUNDLE, cachedData})
  const run = () => {
    const module = {exports: {} as AgentRunModule}
    const wrapper = script.runInThisContext() as (...args: unknown[]) => void
    wrapper.call(module.exports, module.exports, createRequire(AGENT_RUN_BUNDLE), module, AGENT_RUN_BUNDLE, path.dirname(AGENT_RUN_BUNDLE))
    return module.exports
  }
  return {script, run}
}

function readCodeCache(): Buffer | undefined {
  try {
    return fs.readFileSync(AGENT_RUN_CODE_CACHE)
  } catch {
    return undefined
  }
}

export function loadAgentRun(): AgentRunModule {
  return compile(readCodeCache()).run()
}

/** Whether this Node would start agent-run from the code cache (a check for tests and diagnostics). */
export function agentRunCodeCacheStatus(): 'accepted' | 'rejected' | 'missing' {
  const cachedData = readCodeCache()
  if (!cachedData) return 'missing'
  return compile(cachedData).script.cachedDataRejected ? 'rejected' : 'accepted'
}

/**
 * Loads the externals the way a run does (better-sqlite3 loads its addon on first open) and
 * records every package directory that took, relative to the app root.
 */
export function writeAgentRunPackages(): void {
  const require = createRequire(AGENT_RUN_BUNDLE)
  const before = new Set(Object.keys(require.cache))
  const Database = require('better-sqlite3') as new (file: string) => {close(): void}
  new Database(':memory:').close()
  const packages = new Set<string>()
  for (const file of Object.keys(require.cache)) {
    if (before.has(file)) continue
    const match = /^(.*\/node_modules\/(?:@[^/]+\/)?[^/]+)\//.exec(file)
    if (match?.[1]) packages.add(path.relative(APP_ROOT, match[1]))
  }
  fs.writeFileSync(path.join(APP_ROOT, AGENT_RUN_FILES.packages), `${JSON.stringify([...packages].sort(), null, 2)}\n`)
}

/** Written at build time, after the bundle's top level has run, so its eager functions are in it. */
export function writeAgentRunCodeCache(): void {
  const {script, run} = compile(undefined)
  run()
  fs.writeFileSync(AGENT_RUN_CODE_CACHE, script.createCachedData())
}
