'use strict'
// Loads agent-run, one bundled file (dist/agent-run.cjs, scripts/bundle-agent-run.js), with V8's
// code cache: it starts once per message, and compiling ~2 MB of JavaScript from scratch costs it
// ~20 ms more than reading the cached bytecode. A cache V8 rejects (another Node build) only costs
// that time. Plain CommonJS with Node's modules only: going through an ES module first costs every
// agent-run Node's ESM loader set-up (≈ 10 ms of CPU).
const fs = require('node:fs')
const Module = require('node:module')
const path = require('node:path')
const vm = require('node:vm')

const AGENT_RUN_BUNDLE = path.join(__dirname, '..', 'dist', 'agent-run.cjs')
const AGENT_RUN_CODE_CACHE = `${AGENT_RUN_BUNDLE}.v8cache`

/** The bundle as a vm.Script, and `run()`, which evaluates its top level and returns its exports ({main}). */
function compileAgentRun(cachedData) {
  const script = new vm.Script(Module.wrap(fs.readFileSync(AGENT_RUN_BUNDLE, 'utf8')), {filename: AGENT_RUN_BUNDLE, cachedData})
  const run = () => {
    const module = {exports: {}}
    const wrapper = script.runInThisContext()
    wrapper.call(module.exports, module.exports, Module.createRequire(AGENT_RUN_BUNDLE), module, AGENT_RUN_BUNDLE, path.dirname(AGENT_RUN_BUNDLE))
    return module.exports
  }
  return {script, run}
}

function readAgentRunCodeCache() {
  try {
    return fs.readFileSync(AGENT_RUN_CODE_CACHE)
  } catch {
    return undefined
  }
}

function loadAgentRun() {
  return compileAgentRun(readAgentRunCodeCache()).run()
}

module.exports = {AGENT_RUN_BUNDLE, AGENT_RUN_CODE_CACHE, compileAgentRun, readAgentRunCodeCache, loadAgentRun}
