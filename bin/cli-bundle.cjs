'use strict'
// Loads a bundle (dist/cli.cjs or one of dist/lite/, made by scripts/bundle-cli.js, and agent-run's,
// dist/agent-run.cjs, through bin/agent-run.cjs) with its V8 code cache. Plain CommonJS with
// Node's modules only: it runs before anything else at every start.
const fs = require('node:fs')
const Module = require('node:module')
const path = require('node:path')
const vm = require('node:vm')

/** Relative to the app root. */
const CLI_FILES = {
  bundle: 'dist/cli.cjs',
  codeCache: 'dist/cli.cjs.v8cache',
  /** The source files the bundle was built from (for the guard test against stale code). */
  sources: 'dist/cli.sources.json',
  manifest: 'oclif.manifest.json',
  /** Bundles of the commands people and scripts run most, one each, without oclif (src/cli/lite/). */
  liteDir: 'dist/lite',
  /** The command ids with a lite bundle, and `help-pages`, the bundle that prints help pages. */
  liteIndex: 'dist/lite/index.json',
}
/**
 * Outside the bundle: oclif's TypeScript support (dev trees only; bin/run.js turns it off),
 * native addons, and the connectors' clients, which only `serve` loads (lazily). The lite
 * bundles hold better-sqlite3's JavaScript too (their gateway.db opens load its addon by path,
 * src/runtime/util/sqlite.ts).
 */
const CLI_EXTERNALS = [
  'typescript',
  'tsx',
  'ts-node',
  'better-sqlite3',
  'discord.js',
  '@slack/socket-mode',
  '@slack/web-api',
  'ws',
]

/** `agent/create.js` -> `agent:create` (oclif's ids; the topic separator shown to users is a space). */
function commandIdOf(relativeFile) {
  return relativeFile.replace(/\.js$/, '').split(path.sep).join(':')
}

/**
 * A bundle (the format of scripts/bundle-format.js) as a vm.Script, with its code cache
 * (`${file}.v8cache`) unless `codeCache: false`. esbuild inlines the bundle's own import()s and
 * turns the externals' into require(), and oclif require()s the CLI bundle as its command target,
 * so Node's loader for a real import() is a fallback, not the path.
 */
function compileBundle(root, options = {}) {
  const filename = path.join(root, options.bundle ?? CLI_FILES.bundle)
  let cachedData
  if (options.codeCache !== false) {
    try {
      cachedData = fs.readFileSync(`${filename}.v8cache`)
    } catch {
      // no cache (a build in progress): compiling costs time, not correctness
    }
  }
  // latin1: the bundle is ASCII, and Node keeps a large latin1 string outside the V8 heap
  const script = new vm.Script(fs.readFileSync(filename, 'latin1'), {
    filename,
    cachedData,
    // a real import() (of a non-literal specifier) still works; Node warns that this is experimental only if one runs
    importModuleDynamically: vm.constants.USE_MAIN_CONTEXT_DEFAULT_LOADER,
  })
  return {filename, script}
}

/**
 * Compiles and runs a bundle, registered as a CommonJS module, so oclif's own require() of the
 * CLI bundle finds this instance instead of compiling it again.
 */
function loadCliBundle(root, options = {}) {
  const {filename, script} = compileBundle(root, options)
  const module = new Module(filename, null)
  module.filename = filename
  module.paths = Module._nodeModulePaths(path.dirname(filename))
  Module._cache[filename] = module
  script
    .runInThisContext()
    .call(module.exports, module.exports, Module.createRequire(filename), module, filename, path.dirname(filename))
  module.loaded = true
  return {exports: module.exports, script}
}

/** `agent:list` -> dist/lite/agent-list.cjs */
const liteBundleFile = (id) => `${CLI_FILES.liteDir}/${id.replace(/:/g, '-')}.cjs`

/**
 * The lite bundle argv goes to first: the help pages' for `WORDS… --help`, else its command's
 * (`[TOPIC] COMMAND …`), else the help pages' again when argv is only words (a topic); undefined
 * when none is built (oclif's argv).
 */
function liteBundleFor(root, argv) {
  let ids
  try {
    ids = JSON.parse(fs.readFileSync(path.join(root, CLI_FILES.liteIndex), 'utf8'))
  } catch {
    return undefined // not built yet
  }
  const asksHelp = argv.at(-1) === '--help'
  const onlyWords = (asksHelp ? argv.slice(0, -1) : argv).every((word) => /^[a-z][a-z0-9-]*$/.test(word))
  if (asksHelp && onlyWords) return liteBundleFile('help-pages')
  const id = [argv.slice(0, 2).join(':'), argv.slice(0, 1).join(':')].find((candidate) => ids.includes(candidate))
  if (id !== undefined) return liteBundleFile(id)
  return onlyWords ? liteBundleFile('help-pages') : undefined
}

module.exports = {CLI_EXTERNALS, CLI_FILES, commandIdOf, compileBundle, liteBundleFile, liteBundleFor, loadCliBundle}
