import fs from 'node:fs'
import Module, {createRequire} from 'node:module'
import path from 'node:path'
import {fileURLToPath} from 'node:url'
import vm from 'node:vm'

/**
 * agent-run as one bundled file (scripts/bundle-agent-run.js) loaded with V8's code cache: it
 * starts once per message, and compiling ~2 MB of JavaScript from scratch costs it ~20 ms more
 * than reading the cached bytecode. A cache V8 rejects (another Node build) only costs that time.
 */

const DIST = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..', '..')
export const AGENT_RUN_BUNDLE = path.join(DIST, 'agent-run.cjs')
export const AGENT_RUN_CODE_CACHE = path.join(DIST, 'agent-run.cjs.v8cache')

interface AgentRunModule {
  main(): Promise<void>
}

function compile(cachedData: Buffer | undefined): {script: vm.Script; run(): AgentRunModule} {
  const script = new vm.Script(Module.wrap(fs.readFileSync(AGENT_RUN_BUNDLE, 'utf8')), {filename: AGENT_RUN_BUNDLE, cachedData})
  const run = () => {
    const module = {exports: {} as AgentRunModule}
    const wrapper = script.runInThisContext() as (...args: unknown[]) => void
    wrapper.call(module.exports, module.exports, createRequire(AGENT_RUN_BUNDLE), module, AGENT_RUN_BUNDLE, DIST)
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

/** Written at build time, after the bundle's top level has run, so its eager functions are in it. */
export function writeAgentRunCodeCache(): number {
  const {script, run} = compile(undefined)
  run()
  const data = script.createCachedData()
  fs.writeFileSync(AGENT_RUN_CODE_CACHE, data)
  return data.length
}
