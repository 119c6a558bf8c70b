import fs from 'node:fs'
import {createRequire} from 'node:module'
import path from 'node:path'
import type vm from 'node:vm'
import {APP_ROOT} from '../util/app-root.js'
import {sqlitePackageDir} from '../util/sqlite.js'

/**
 * agent-run as one bundled file (scripts/bundle-agent-run.js), loaded with V8's code cache by
 * bin/agent-run.cjs (plain CommonJS: what every agent-run start goes through). This module is the
 * build's and the tests' side of it.
 */

/**
 * What starts agent-run, relative to the app root: all an isolation image needs of the app
 * besides the packages in `packages` (and the sandbox helper).
 */
export const AGENT_RUN_FILES = {
  bundle: 'dist/agent-run.cjs',
  codeCache: 'dist/agent-run.cjs.v8cache',
  /** The providers and LLM SDKs, which only direct mode (agent-run run by hand) loads. */
  providers: 'dist/agent-run-providers.cjs',
  /** The node_modules packages agent-run loads at run time (its externals and theirs), recorded at build time. */
  packages: 'dist/agent-run.packages.json',
  /** Loads the bundle with its code cache; Node's modules only. */
  loader: 'bin/agent-run.cjs',
  /** The loader of every bundle, which bin/agent-run.cjs uses. */
  bundleLoader: 'bin/cli-bundle.cjs',
  entry: 'bin/run.js',
  /** Makes bin/run.js CommonJS (the app's package.json says ES modules). */
  entryType: 'bin/package.json',
  manifest: 'package.json',
}

interface AgentRunLoader {
  AGENT_RUN_CODE_CACHE: string
  loadAgentRun(options?: {codeCache?: boolean}): {exports: unknown; script: vm.Script}
  compileAgentRun(): vm.Script
}
/** Required on first use: the CLI bundle holds this module for AGENT_RUN_FILES alone. */
const loader = (): AgentRunLoader =>
  createRequire(path.join(APP_ROOT, 'package.json'))(path.join(APP_ROOT, AGENT_RUN_FILES.loader)) as AgentRunLoader

export const AGENT_RUN_BUNDLE = path.join(APP_ROOT, AGENT_RUN_FILES.bundle)

/** Whether this Node would start agent-run from the code cache (a check for tests and diagnostics). */
export function agentRunCodeCacheStatus(): 'accepted' | 'rejected' | 'missing' {
  if (!fs.existsSync(loader().AGENT_RUN_CODE_CACHE)) return 'missing'
  return loader().compileAgentRun().cachedDataRejected ? 'rejected' : 'accepted'
}

/**
 * The node_modules packages a run loads files of: better-sqlite3, for its addon (its JavaScript is
 * in the bundle, and openSqlite loads the addon by path). Recorded relative to the app root.
 */
export function writeAgentRunPackages(): void {
  const packages = [path.relative(APP_ROOT, sqlitePackageDir())]
  fs.writeFileSync(path.join(APP_ROOT, AGENT_RUN_FILES.packages), `${JSON.stringify(packages, null, 2)}\n`)
}

/** Written at build time, after the bundle's top level has run, so its eager functions are in it. */
export function writeAgentRunCodeCache(): void {
  const {script} = loader().loadAgentRun({codeCache: false})
  fs.writeFileSync(loader().AGENT_RUN_CODE_CACHE, script.createCachedData())
}
