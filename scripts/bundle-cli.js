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
import {IMPORT_META_URL, finishBundle, selfWrapping} from './bundle-format.js'

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..')
const require = createRequire(import.meta.url)
const {CLI_FILES, CLI_EXTERNALS, commandIdOf, liteBundleFile, loadCliBundle} = require('../bin/cli-bundle.cjs')
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
      const commands = [
        ['config:check', []],
        ['agent:list', []],
        ['runs', []],
        ['sandbox:exec', ['--agent', 'meepa', '--', '/bin/true']],
      ]
      for (const [id, argv] of commands) await config.runCommand(id, argv).catch(() => {})
    } finally {
      ;[process.stdout.write, process.stderr.write] = write
      process.exitCode = 0
    }
  } finally {
    removeScratchHome(home)
  }
  fs.writeFileSync(path.join(root, CLI_FILES.codeCache), script.createCachedData())
  process.exit(0)
}

// A lite bundle's code cache: the bundle run once for each argv given (JSON) in a scratch home.
if (process.argv[2] === '--write-lite-code-cache') {
  const [bundleFile, argvs] = [process.argv[3], JSON.parse(process.argv[4])]
  const {exports: lite, script} = loadCliBundle(root, {bundle: bundleFile, codeCache: false})
  const home = fs.mkdtempSync(path.join(os.tmpdir(), 'meepa-warm-'))
  // a config in the scratch home (its first-run default): sandbox exec leaves a first run to oclif
  spawnSync(process.execPath, [path.join(root, 'bin', 'run.js'), 'agent', 'list'], {
    env: {...process.env, MEEPAGATEWAY_HOME: home},
    stdio: 'ignore',
  })
  const exit = process.exit
  // an error ends the process the way oclif does (process.exit); here it ends only that run
  process.exit = (code) => {
    throw Object.assign(new Error('exit'), {exitCode: code})
  }
  process.env.MEEPAGATEWAY_HOME = home
  // `send` is warmed as most starts run it: handing its message to a gateway (this one answers at once)
  const gateway = bundleFile === liteBundleFile('send') ? await fakeGatewayForSend(home) : undefined
  try {
    // each run bounded: a build machine's hung Docker engine would hold each container command for its deadline (30 s)
    for (const argv of argvs)
      await Promise.race([
        lite.run(argv, root).catch(() => {}),
        new Promise((resolve) => setTimeout(resolve, 5000).unref()),
      ])
  } finally {
    process.exit = exit
    process.exitCode = 0
    gateway?.close()
    removeScratchHome(home)
  }
  fs.writeFileSync(path.join(root, `${bundleFile}.v8cache`), script.createCachedData())
  process.exit(0)
}

/**
 * A stand-in for `serve` on the local send socket of `home` (src/runtime/connectors/local-send/):
 * it answers every message with a reply.
 */
async function fakeGatewayForSend(home) {
  const {localSendDir, localSendSocket, localSendToken} =
    await import('../dist/runtime/connectors/local-send/protocol.js')
  const net = await import('node:net')
  fs.mkdirSync(localSendDir(home), {recursive: true, mode: 0o700})
  fs.writeFileSync(localSendToken(home), 'warm')
  const output = {
    version: 1,
    ok: true,
    run_id: 'run_warm',
    reply: {content: 'warm'},
    usage: {input_tokens: 1, output_tokens: 1},
  }
  const server = net.createServer((socket) => {
    socket.once('data', () =>
      socket.end(`${JSON.stringify({type: 'log', line: 'warm'})}\n${JSON.stringify({type: 'result', output})}\n`),
    )
  })
  await new Promise((resolve) => server.listen(localSendSocket(home), resolve))
  return server
}

function commandFiles(dir) {
  return fs.readdirSync(dir, {withFileTypes: true}).flatMap((entry) => {
    const file = path.join(dir, entry.name)
    if (entry.isDirectory()) return commandFiles(file)
    return entry.name.endsWith('.js') && entry.name !== 'base-command.js' ? [file] : []
  })
}

const commandsDir = path.join(dist, 'commands')
const commands = commandFiles(commandsDir)
  .sort()
  .map((file) => ({id: commandIdOf(path.relative(commandsDir, file)), file}))
// Each command is a getter around require(): esbuild then evaluates a command's modules only when
// oclif asks for that command (with the manifest, only the one being run), not all at start.
const entry = [
  'export const COMMANDS = {}',
  ...commands.map(
    ({id, file}) =>
      `Object.defineProperty(COMMANDS, ${JSON.stringify(id)}, {enumerable: true, get: () => require(${JSON.stringify(file)}).default})`,
  ),
  `Object.defineProperty(COMMANDS, 'help', {enumerable: true, get: () => require('@oclif/plugin-help').commands.help})`,
  // a getter too: loading the bundle (as the build does) does not evaluate oclif
  "export const core = () => require('@oclif/core')",
].join('\n')

/** app-root.js finds the app from its own location; inside the bundle that is dist/. */
const appRootInBundle = (outfile) => ({
  name: 'app-root',
  setup(build) {
    build.onLoad({filter: /[\\/]runtime[\\/](?:.*[\\/])?app-root\.js$/}, () => ({
      contents: `import path from 'node:path'\nexport const APP_ROOT = path.resolve(__dirname, ${JSON.stringify(path.relative(path.dirname(outfile), root))})\nexport const FROM_SOURCE = false\n`,
      loader: 'js',
    }))
  },
})

/** oclif checks its own package.json's engines with semver at load; npm checks ours at install. */
const noEngineCheck = {
  name: 'no-engine-check',
  setup(build) {
    build.onLoad({filter: /[\\/]@oclif[\\/]core[\\/]lib[\\/]index\.js$/}, async (args) => {
      const text = await fs.promises.readFile(args.path, 'utf8')
      if (!text.includes('\ncheckNodeVersion();'))
        throw new Error('@oclif/core changed: checkNodeVersion() not found in lib/index.js')
      return {contents: text.replace('\ncheckNodeVersion();', '\n'), loader: 'js'}
    })
  },
}

/**
 * oclif sorts its commands with localeCompare, whose first call maps ICU's collation data: ≈ 3 MB
 * of every `serve`'s resident memory. Our localeOrder gives the same order (ASCII ids, en-US)
 * without it, and falls back to localeCompare elsewhere.
 */
const noCollatorForCommandIds = {
  name: 'no-collator-for-command-ids',
  setup(build) {
    build.onLoad({filter: /[\\/]@oclif[\\/]core[\\/]lib[\\/]config[\\/]plugin\.js$/}, async (args) => {
      const text = await fs.promises.readFile(args.path, 'utf8')
      const sort = '.sort((a, b) => a.id.localeCompare(b.id))'
      if (!text.includes(sort)) throw new Error(`@oclif/core changed: ${sort} not found in lib/config/plugin.js`)
      const localeOrder = JSON.stringify(path.join(dist, 'runtime', 'util', 'locale-order.js'))
      return {
        contents: `const {localeOrder: meepaLocaleOrder} = require(${localeOrder});\n${text.replace(sort, '.sort((a, b) => meepaLocaleOrder(a.id, b.id))')}`,
        loader: 'js',
      }
    })
  },
}

/** esbuild's options for both bundles; a warning fails the build. */
async function bundle({entry, sourcefile, outfile, plugins = [], external = CLI_EXTERNALS}) {
  const result = await esbuild.build({
    stdin: {contents: entry, resolveDir: dist, sourcefile},
    bundle: true,
    platform: 'node',
    format: 'cjs',
    target: 'node20',
    outfile,
    external,
    plugins: [appRootInBundle(outfile), ...plugins],
    // the precompiled config validator requires ajv's runtime helpers relative to itself
    // (a getter: most starts never ask, and pathToFileURL loads Node's URL machinery)
    define: IMPORT_META_URL,
    // its own CommonJS wrapper (scripts/bundle-format.js)
    ...selfWrapping(),
    metafile: true,
    // a third less to read at every start; names are kept (stack traces stay readable)
    minifyWhitespace: true,
    minifySyntax: true,
    legalComments: 'none',
    logLevel: 'silent',
  })
  // A warning is a bundle that misbehaves at run time (import.meta is empty in CommonJS, an
  // unresolved require throws): fail the build instead of shipping it.
  const warnings = result.warnings.filter(
    (warning) => !/node_modules[\\/]@oclif[\\/]core[\\/]/.test(warning.location?.file ?? ''),
  )
  if (warnings.length > 0) {
    const messages = await esbuild.formatMessages(warnings, {kind: 'warning'})
    process.stderr.write(
      `bundle-cli: ${messages.join('\n')}\n  Try this: keep import.meta and dynamic require() out of the commands and the runtime\n`,
    )
    process.exit(1)
  }
  finishBundle(outfile)
  return result
}

/** The TypeScript sources a bundle was built from, with their hashes, into `sources`. */
function addSources(sources, result) {
  for (const input of Object.keys(result.metafile.inputs)) {
    const compiled = path.resolve(root, input)
    if (!compiled.startsWith(dist + path.sep)) continue
    const source = path.join(root, 'src', path.relative(dist, compiled)).replace(/\.js$/, '.ts')
    if (fs.existsSync(source))
      sources[path.relative(root, source)] = createHash('sha256').update(fs.readFileSync(source)).digest('hex')
  }
}

// a lite bundle from an earlier build would answer the help runs below instead of oclif
fs.rmSync(path.join(root, CLI_FILES.liteDir), {recursive: true, force: true})
const result = await bundle({
  entry,
  sourcefile: 'cli-entry.js',
  outfile,
  plugins: [noEngineCheck, noCollatorForCommandIds],
})
// The TypeScript sources both bundles were built from, with their hashes: the guard test
// (test/cli/fresh-build.test.ts) finds a bundle older than src/ with it (written with the lite bundle, below).
const sources = {}
addSources(sources, result)

// The manifest: command ids, flags, summaries and examples, so `--help` and lookups read one file.
const manifestFile = path.join(root, CLI_FILES.manifest)
fs.rmSync(manifestFile, {force: true})
const {exports: cli} = loadCliBundle(root, {codeCache: false})
const {Plugin} = cli.core()
const plugin = new Plugin({root, isRoot: true, type: 'core', ignoreManifest: true, errorOnManifestCreate: true})
await plugin.load()
fs.writeFileSync(manifestFile, `${JSON.stringify(plugin.manifest, null, 2)}\n`)

// The code cache holds what most starts compile: the bundle's top level, oclif's core, the
// manifest, help, and the most used commands run once in a scratch home (config load and
// validation, SQLite, the sandbox helper). It is made in a fresh process after
// that warm-up, not after the manifest build above, which evaluates every command: a cache of
// everything costs more to load than it saves. Needs the sandbox helper built first.
const warm = spawnSync(process.execPath, [fileURLToPath(import.meta.url), '--write-code-cache'], {stdio: 'inherit'})
if (warm.status !== 0) process.exit(warm.status ?? 1)

// Help pages as oclif prints them when the output is not a terminal (80 columns, no colour), for
// the lite bundle to print without oclif (src/cli/lite/help.ts). Each is bin/run.js itself: the
// lite bundle does not exist yet, so oclif renders every one.
const {HELP_PAGES_FILE, helpArgvForms} = await import('../dist/cli/lite/help.js')
const commandIds = Object.keys(JSON.parse(fs.readFileSync(manifestFile, 'utf8')).commands)
const topics = [
  ...new Set(
    commandIds.flatMap((id) =>
      id
        .split(':')
        .slice(0, -1)
        .map((_, index, parts) => parts.slice(0, index + 1).join(':')),
    ),
  ),
]
const helpEnv = Object.fromEntries(
  Object.entries(process.env).filter(
    ([name]) => !['OCLIF_COLUMNS', 'FORCE_COLOR', 'DEBUG', 'MEEPAGATEWAY_DEBUG', 'NODE_OPTIONS'].includes(name),
  ),
)
const {version} = JSON.parse(fs.readFileSync(path.join(root, 'package.json'), 'utf8'))
// what oclif prints in the pages (its platform is `wsl` under WSL), so help.ts can replace it
const userAgent = await (await import('../dist/cli/lite/run.js')).oclifUserAgent(version)
const pages = {}
for (const argv of helpArgvForms({commands: commandIds, topics})) {
  const shown = spawnSync(process.execPath, [path.join(root, 'bin', 'run.js'), ...argv], {
    env: helpEnv,
    encoding: 'utf8',
    stdio: ['ignore', 'pipe', 'pipe'],
  })
  if (shown.status !== 0 || shown.stderr !== '')
    throw new Error(`bundle-cli: \`${argv.join(' ')}\` printed no help page (exit ${shown.status}): ${shown.stderr}`)
  pages[argv.join(' ')] = shown.stdout
}
fs.mkdirSync(path.join(root, CLI_FILES.liteDir), {recursive: true})
fs.writeFileSync(path.join(root, HELP_PAGES_FILE), `${JSON.stringify({userAgent, pages}, null, 1)}\n`)

// The lite bundles, one per command in src/cli/lite/commands.ts (with src/cli/lite/core.ts as its
// @oclif/core) and one for the help pages: bin/run.js tries the one argv names first. One each:
// a start reads and deserialises only its own command's code.
const {LITE_COMMANDS} = await import('../dist/cli/lite/commands.js')
// the lite path runs no oclif hooks: one added to package.json would be skipped there without a word
if (JSON.parse(fs.readFileSync(path.join(root, 'package.json'), 'utf8')).oclif?.hooks) {
  throw new Error(
    'bundle-cli: package.json declares oclif hooks, which the lite bundles (src/cli/lite/) do not run; run them there or drop the lite bundles',
  )
}
/** The commands' `@oclif/core` is src/cli/lite/core.ts. */
const liteCore = {
  name: 'lite-core',
  setup(build) {
    build.onResolve({filter: /^@oclif\/core$/}, () => ({path: path.join(dist, 'cli', 'lite', 'core.js')}))
  },
}
/**
 * `send`'s lite bundle holds what hands the message to a running gateway; the one-shot run (config,
 * runners, SQLite: most of its code) is a bundle of its own, loaded only when no gateway takes it.
 */
const SEND_ONE_SHOT = 'send-one-shot'
const sendOneShotApart = {
  name: 'send-one-shot-apart',
  setup(build) {
    build.onResolve({filter: /[\\/]runtime[\\/]send[\\/]one-shot\.js$/}, (args) =>
      args.kind === 'dynamic-import' && /[\\/]commands[\\/]send\.js$/.test(args.importer)
        ? {path: 'send-one-shot', namespace: SEND_ONE_SHOT}
        : undefined,
    )
    build.onResolve({filter: /^meepa-cli-bundle$/}, () => ({path: '../../bin/cli-bundle.cjs', external: true}))
    build.onLoad({filter: /.*/, namespace: SEND_ONE_SHOT}, () => ({
      contents: [
        "import {loadCliBundle} from 'meepa-cli-bundle'",
        "import {APP_ROOT} from './runtime/util/app-root.js'",
        `export const sendOneShot = (options) => loadCliBundle(APP_ROOT, {bundle: ${JSON.stringify(liteBundleFile(SEND_ONE_SHOT))}}).exports.sendOneShot(options)`,
      ].join('\n'),
      loader: 'js',
      resolveDir: dist,
    }))
  },
}
/**
 * The `container` commands over an `engines:` list (per engine, the runners' engine list) are the
 * full CLI's: in a lite bundle their dynamic import is a module that defers to oclif, so the
 * common case (no list) does not read that code at every start.
 */
const ENGINES_TO_OCLIF = 'engines-to-oclif'
const enginesToOclif = {
  name: 'engines-to-oclif',
  setup(build) {
    build.onResolve({filter: /[\\/](container[\\/]per-engine|runners[\\/]container[\\/]engines)\.js$/}, (args) =>
      args.kind === 'dynamic-import' && /[\\/]commands[\\/]container[\\/]/.test(args.importer)
        ? {path: args.path, namespace: ENGINES_TO_OCLIF}
        : undefined,
    )
    build.onLoad({filter: /.*/, namespace: ENGINES_TO_OCLIF}, () => ({
      contents: "import {DeferToOclif} from './cli/lite/parse.js'\nthrow new DeferToOclif()",
      loader: 'js',
      resolveDir: dist,
    }))
  },
}
const liteBundles = [
  // before `send`, whose warm-up loads it
  {
    id: SEND_ONE_SHOT,
    // only the runtime's one-shot path; `run` is for its warm-up (the scratch home's agent, no provider key there)
    entry:
      "import {sendOneShot} from './runtime/send/one-shot.js'\nexport {sendOneShot}\nexport const run = () => sendOneShot({agentId: 'meepa', channel: 'cli', content: 'hi', notice: () => {}})",
    warm: [[]],
    notACommand: true,
  },
  ...LITE_COMMANDS.map((id) => {
    const file = commands.find((command) => command.id === id)?.file
    if (!file) throw new Error(`bundle-cli: src/cli/lite/commands.ts names ${id}, which is not a command`)
    const run =
      id === 'sandbox:exec'
        ? "import {sandboxExecWithoutOclif} from './cli/fast-paths.js'\nexport const run = (argv) => argv[0] === 'sandbox' && argv[1] === 'exec' ? sandboxExecWithoutOclif(argv.slice(2)) : Promise.resolve(undefined)"
        : `import {runCommandWithoutOclif} from './cli/lite/run.js'\nimport Command from ${JSON.stringify(file)}\nexport const run = (argv) => runCommandWithoutOclif(argv, ${JSON.stringify(id)}, Command)`
    // what a start runs, once in the scratch home (send, with no provider key there, up to the provider
    // call; `container clean` only as a dry run: on the build machine's engine it would remove images)
    const warm = {
      send: [['send', '--agent', 'meepa', 'hi']],
      'sandbox:exec': [['sandbox', 'exec', '--agent', 'meepa', '--', '/bin/true']],
      'container:clean': [
        ['container', 'clean', '--dry-run'],
        ['container', 'clean', '--dry-run', '--json'],
      ],
      'agent:create': [
        ['agent', 'create', 'meepa'],
        ['agent', 'create', 'warm', '--json'],
      ],
      'sandbox:explain': [
        ['sandbox', 'explain', '--agent', 'meepa'],
        ['sandbox', 'explain', '--agent', 'meepa', '--json'],
      ],
    }[id] ?? [id.split(':'), [...id.split(':'), '--json']]
    return {
      id,
      entry: run,
      warm,
      plugins: id === 'send' ? [sendOneShotApart] : id.startsWith('container:') ? [enginesToOclif] : [],
    }
  }),
  {
    id: 'help-pages',
    entry: `import {printHelpPageWithoutOclif} from './cli/lite/run.js'\nexport const run = async (argv, root) => printHelpPageWithoutOclif(argv, root, ${JSON.stringify(version)})`,
    warm: [['--help'], ['runs', '--help']],
  },
]
for (const {id, entry, warm, plugins = []} of liteBundles) {
  const bundleFile = liteBundleFile(id)
  const built = await bundle({
    entry,
    sourcefile: `lite-${id}.js`,
    outfile: path.join(root, bundleFile),
    plugins: [liteCore, ...plugins],
    external: CLI_EXTERNALS.filter((name) => name !== 'better-sqlite3'),
  })
  // better-sqlite3's own addon lookup fails from inside a bundle: only openSqlite may open files here
  if (Object.keys(built.metafile.inputs).some((input) => input.endsWith('runtime/workspace/memory.js'))) {
    throw new Error(
      `bundle-cli: the lite bundle of ${id} holds memory.js, which opens SQLite without src/runtime/util/sqlite.ts`,
    )
  }
  if (
    Object.keys(built.metafile.inputs).some((input) =>
      /node_modules[\\/]@oclif[\\/]core[\\/]lib[\\/](index|command|config[\\/])/.test(input),
    )
  ) {
    throw new Error(
      `bundle-cli: the lite bundle of ${id} reached oclif itself; keep its command to what src/cli/lite/core.ts provides`,
    )
  }
  addSources(sources, built)
  // the commands write to the descriptors themselves (src/cli/lite/write.ts): their output goes nowhere
  const warmed = spawnSync(
    process.execPath,
    [fileURLToPath(import.meta.url), '--write-lite-code-cache', bundleFile, JSON.stringify(warm)],
    {stdio: ['ignore', 'ignore', 'pipe'], encoding: 'utf8'},
  )
  if (warmed.status !== 0)
    throw new Error(`bundle-cli: warming ${bundleFile} failed (exit ${warmed.status}): ${warmed.stderr}`)
}
fs.writeFileSync(
  path.join(root, CLI_FILES.liteIndex),
  `${JSON.stringify(liteBundles.filter((lite) => !lite.notACommand).map(({id}) => id))}\n`,
)
fs.writeFileSync(
  path.join(root, CLI_FILES.sources),
  `${JSON.stringify(Object.fromEntries(Object.entries(sources).sort()), null, 2)}\n`,
)

/** A scratch home's removal: a root build's runs mounted its workspace volumes (src/runtime/workspace/volume.ts). */
function removeScratchHome(home) {
  const table = fs.existsSync('/proc/self/mountinfo') ? fs.readFileSync('/proc/self/mountinfo', 'utf8') : ''
  const below = table
    .split('\n')
    .map((line) => line.split(' ')[4])
    .filter((mountPoint) => mountPoint?.startsWith(`${home}/`))
  for (const mountPoint of below.reverse()) spawnSync('umount', [mountPoint], {stdio: 'ignore'})
  fs.rmSync(home, {recursive: true, force: true})
}
