#!/usr/bin/env node
// Bundles the CLI: every command in dist/commands and @oclif/core (with the help command of
// @oclif/plugin-help, so no plugin is loaded at start) into one CommonJS file, dist/cli.cjs,
// with a V8 code cache, and writes oclif.manifest.json from it. bin/run.js loads the bundle from
// the cache: resolving, reading and compiling ~400 small modules at every start cost more than
// most commands' own work. Heavy libraries stay behind dynamic import() (evaluated on the path
// that needs them); native addons and the connectors' clients stay outside the bundle.
// Run by `npm run build` after tsc (and by the test setup).
import esbuild from 'esbuild'
import {spawnSync} from 'node:child_process'
import {createHash} from 'node:crypto'
import fs from 'node:fs'
import {createRequire} from 'node:module'
import os from 'node:os'
import path from 'node:path'
import {fileURLToPath} from 'node:url'

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..')
const require = createRequire(import.meta.url)
const {CLI_FILES, CLI_EXTERNALS, commandIdOf, loadCliBundle} = require('../bin/cli-bundle.cjs')
const dist = path.join(root, 'dist')
const outfile = path.join(root, CLI_FILES.bundle)

if (process.argv.includes('--write-code-cache')) {
  const {exports: cli, script} = loadCliBundle(root, {codeCache: false})
  const home = fs.mkdtempSync(path.join(os.tmpdir(), 'meepa-warm-'))
  try {
    const core = cli.core()
    core.settings.enableAutoTranspile = false
    const config = await core.Config.load({root, userPlugins: false, devPlugins: false})
    const write = [process.stdout.write, process.stderr.write]
    process.stdout.write = process.stderr.write = () => true
    process.env.MEEPAGATEWAY_HOME = home
    try {
      await new core.Help(config).showHelp([])
      // the commands people and scripts run most; each leaves its compiled functions in the cache
      // (one that fails here, say with no Landlock on the build machine, still warmed most of its path)
      const commands = [['config:check', []], ['agent:list', []], ['runs', []], ['sandbox:exec', ['--agent', 'meepa', '--', '/bin/true']]]
      for (const [id, argv] of commands) await config.runCommand(id, argv).catch(() => {})
      await cli.fastPaths().sandboxExecWithoutOclif(['--agent', 'meepa', '--', '/bin/true'])
    } finally {
      ;[process.stdout.write, process.stderr.write] = write
      process.exitCode = 0
    }
  } finally {
    fs.rmSync(home, {recursive: true, force: true})
  }
  fs.writeFileSync(path.join(root, CLI_FILES.codeCache), script.createCachedData())
  process.exit(0)
}

function commandFiles(dir) {
  return fs.readdirSync(dir, {withFileTypes: true}).flatMap((entry) => {
    const file = path.join(dir, entry.name)
    if (entry.isDirectory()) return commandFiles(file)
    return entry.name.endsWith('.js') && entry.name !== 'base-command.js' ? [file] : []
  })
}

const commandsDir = path.join(dist, 'commands')
const commands = commandFiles(commandsDir).sort().map((file) => ({id: commandIdOf(path.relative(commandsDir, file)), file}))
const helpCommand = path.join(path.dirname(require.resolve('@oclif/plugin-help')), 'commands', 'help.js')
// Each command is a getter around require(): esbuild then evaluates a command's modules only when
// oclif asks for that command (with the manifest, only the one being run), not all at start.
const entry = [
  'export const COMMANDS = {}',
  ...commands.map(({id, file}) => `Object.defineProperty(COMMANDS, ${JSON.stringify(id)}, {enumerable: true, get: () => require(${JSON.stringify(file)}).default})`),
  `Object.defineProperty(COMMANDS, 'help', {enumerable: true, get: () => require(${JSON.stringify(helpCommand)}).default})`,
  // getters too: a start that takes a fast path (src/cli/fast-paths.ts) never evaluates oclif
  "export const core = () => require('@oclif/core')",
  "export const fastPaths = () => require('./cli/fast-paths.js')",
].join('\n')

/** app-root.js finds the app from its own location; inside the bundle that is dist/. */
const appRootInBundle = {
  name: 'app-root',
  setup(build) {
    build.onLoad({filter: /[\\/]runtime[\\/](?:.*[\\/])?app-root\.js$/}, () => ({
      contents: "import path from 'node:path'\nexport const APP_ROOT = path.resolve(__dirname, '..')\n",
      loader: 'js',
    }))
  },
}

/** oclif checks its own package.json's engines with semver at load; npm checks ours at install. */
const noEngineCheck = {
  name: 'no-engine-check',
  setup(build) {
    build.onLoad({filter: /[\\/]@oclif[\\/]core[\\/]lib[\\/]index\.js$/}, async (args) => {
      const text = await fs.promises.readFile(args.path, 'utf8')
      if (!text.includes('\ncheckNodeVersion();')) throw new Error('@oclif/core changed: checkNodeVersion() not found in lib/index.js')
      return {contents: text.replace('\ncheckNodeVersion();', '\n'), loader: 'js'}
    })
  },
}

const result = await esbuild.build({
  stdin: {contents: entry, resolveDir: dist, sourcefile: 'cli-entry.js'},
  bundle: true,
  platform: 'node',
  format: 'cjs',
  target: 'node20',
  outfile,
  external: CLI_EXTERNALS,
  plugins: [appRootInBundle, noEngineCheck],
  // the precompiled config validator requires ajv's runtime helpers relative to itself
  define: {'import.meta.url': '__bundleUrl'},
  // The file is its own CommonJS wrapper function, the script's completion value: bin/run.js
  // compiles it as is (no second 2 MB string for Module.wrap), and Node's require() (oclif
  // without bin/run.js, as in tests) runs it through the footer.
  banner: {js: "var __meepaCli = function (exports, require, module, __filename, __dirname) {\nvar __bundleUrl = require('node:url').pathToFileURL(__filename).href;"},
  footer: {js: "};\nif (typeof module === 'object' && module && module.exports) __meepaCli(exports, require, module, __filename, __dirname);\n__meepaCli"},
  metafile: true,
  // a third less to read at every start; names are kept (stack traces stay readable)
  minifyWhitespace: true,
  minifySyntax: true,
  legalComments: 'none',
  logLevel: 'silent',
})
// A warning is a bundle that misbehaves at run time (import.meta is empty in CommonJS, an
// unresolved require throws): fail the build instead of shipping it.
const warnings = result.warnings.filter((warning) => !/node_modules[\\/]@oclif[\\/]core[\\/]/.test(warning.location?.file ?? ''))
if (warnings.length > 0) {
  const messages = await esbuild.formatMessages(warnings, {kind: 'warning'})
  process.stderr.write(`bundle-cli: ${messages.join('\n')}\n  Try this: keep import.meta and dynamic require() out of the commands and the runtime\n`)
  process.exit(1)
}
// The TypeScript sources it was built from, with their hashes: the guard test
// (test/cli/fresh-build.test.ts) finds a bundle older than src/ with it.
const sources = {}
for (const input of Object.keys(result.metafile.inputs)) {
  const compiled = path.resolve(root, input)
  if (!compiled.startsWith(dist + path.sep)) continue
  const source = path.join(root, 'src', path.relative(dist, compiled)).replace(/\.js$/, '.ts')
  if (fs.existsSync(source)) sources[path.relative(root, source)] = createHash('sha256').update(fs.readFileSync(source)).digest('hex')
}
fs.writeFileSync(path.join(root, CLI_FILES.sources), `${JSON.stringify(Object.fromEntries(Object.entries(sources).sort()), null, 2)}\n`)

// The manifest: command ids, flags, summaries and examples, so `--help` and lookups read one file.
const manifestFile = path.join(root, CLI_FILES.manifest)
fs.rmSync(manifestFile, {force: true})
const {exports: cli, script} = loadCliBundle(root, {codeCache: false})
const {Plugin} = cli.core()
const plugin = new Plugin({root, isRoot: true, type: 'core', ignoreManifest: true, errorOnManifestCreate: true})
await plugin.load()
fs.writeFileSync(manifestFile, `${JSON.stringify(plugin.manifest, null, 2)}\n`)

// The code cache holds what most starts compile: the bundle's top level, oclif's core, the
// manifest, help, and the most used commands run once in a scratch home (config load and
// validation, SQLite, the sandbox helper through execa). It is made in a fresh process after
// that warm-up, not after the manifest build above, which evaluates every command: a cache of
// everything costs more to load than it saves. Needs the sandbox helper built first.
const warm = spawnSync(process.execPath, [fileURLToPath(import.meta.url), '--write-code-cache'], {stdio: 'inherit'})
if (warm.status !== 0) process.exit(warm.status ?? 1)
