'use strict'
// Loads agent-run, one bundled file (dist/agent-run.cjs, scripts/bundle-agent-run.js), with V8's
// code cache, through the bundles' loader (bin/cli-bundle.cjs): it starts once per message, and
// compiling its JavaScript from scratch costs it ~20 ms more than reading the cached bytecode. A
// cache V8 rejects (another Node build) only costs that time. Plain CommonJS with Node's modules
// only: going through an ES module first costs every agent-run Node's ESM loader set-up (≈ 10 ms).
const path = require('node:path')
const {compileBundle, loadCliBundle} = require('./cli-bundle.cjs')

const root = path.join(__dirname, '..')
const AGENT_RUN_FILE = 'dist/agent-run.cjs'
const AGENT_RUN_BUNDLE = path.join(root, AGENT_RUN_FILE)
const AGENT_RUN_CODE_CACHE = `${AGENT_RUN_BUNDLE}.v8cache`

/**
 * agent-run's exports ({main}) and its script; `codeCache: false` compiles from source (the build,
 * which then writes the cache).
 */
function loadAgentRun(options = {}) {
  return loadCliBundle(root, {...options, bundle: AGENT_RUN_FILE})
}

/** The compiled script alone (whether V8 took the cache), nothing run. */
function compileAgentRun() {
  return compileBundle(root, {bundle: AGENT_RUN_FILE}).script
}

module.exports = {AGENT_RUN_BUNDLE, AGENT_RUN_CODE_CACHE, compileAgentRun, loadAgentRun}
