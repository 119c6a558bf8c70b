#!/usr/bin/env node
// Bundles agent-run (dist/runtime/agent-run/main.js and everything it loads) into one CommonJS
// file, dist/agent-run.cjs, plus its V8 code cache and the list of packages it loads from
// node_modules (what an isolation image needs); bin/run.js loads them for `agent-run`. agent-run
// starts once per message: resolving and linking hundreds of small ESM files costs more than the
// run's own work. Of better-sqlite3 only the native addon stays outside, loaded by path next to its
// package. The providers and both LLM SDKs, which only direct mode (a person at a shell) loads, are
// a second file, dist/agent-run-providers.cjs: two thirds of the bytes every agent-run (and every
// waiting standby) would otherwise hold in memory. Run by `npm run build` after tsc (and by the
// test setup).
import esbuild from 'esbuild'
import path from 'node:path'
import {fileURLToPath} from 'node:url'
import {IMPORT_META_URL, finishBundle, selfWrapping} from './bundle-format.js'

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..')
const {
  AGENT_RUN_BUNDLE: outfile,
  AGENT_RUN_FILES,
  writeAgentRunCodeCache,
  writeAgentRunPackages,
} = await import('../dist/runtime/agent-run/bundle.js')
const providersFile = path.join(root, AGENT_RUN_FILES.providers)

/**
 * main.js's import() of the providers becomes a require() of their own bundle, next to this one
 * (the loader's require; a real import() would go through Node's ES module loader).
 */
const providersApart = {
  name: 'providers-apart',
  setup(build) {
    const apart = `./${path.basename(providersFile)}`
    build.onResolve({filter: /\/providers\/index\.js$/}, (args) =>
      args.importer.endsWith(path.join('agent-run', 'main.js'))
        ? {path: apart, namespace: 'providers-apart'}
        : undefined,
    )
    build.onLoad({filter: /.*/, namespace: 'providers-apart'}, () => ({
      contents: `module.exports = require(${JSON.stringify(apart)})`,
      loader: 'js',
    }))
    build.onResolve({filter: /^\.\/agent-run-providers\.cjs$/}, (args) => ({path: args.path, external: true}))
  },
}

const results = await Promise.all([
  bundle("export {main} from './runtime/agent-run/main.js'", outfile, [providersApart]),
  bundle("export * from './runtime/providers/index.js'", providersFile, []),
])
// A warning here is a bundle that misbehaves at run time (import.meta is empty in CommonJS, an
// unresolved require throws): fail the build instead of shipping it.
const warnings = results.flatMap((result) => result.warnings)
if (warnings.length > 0) {
  const messages = await esbuild.formatMessages(warnings, {kind: 'warning'})
  process.stderr.write(
    `bundle-agent-run: ${messages.join('\n')}\n  Try this: keep import.meta and dynamic require() out of agent-run's modules\n`,
  )
  process.exit(1)
}

finishBundle(outfile)
finishBundle(providersFile)
writeAgentRunCodeCache()
writeAgentRunPackages()

function bundle(contents, file, plugins) {
  return esbuild.build({
    stdin: {
      contents,
      resolveDir: path.join(root, 'dist'),
      sourcefile: 'agent-run-entry.js',
    },
    plugins,
    bundle: true,
    platform: 'node',
    format: 'cjs',
    target: 'node20',
    outfile: file,
    // better-sqlite3's JavaScript too: its addon is loaded by path (src/runtime/util/sqlite.ts)
    define: IMPORT_META_URL,
    // the format bin/cli-bundle.cjs loads (scripts/bundle-format.js); half the bytes to read at every run
    ...selfWrapping(),
    minifyWhitespace: true,
    minifySyntax: true,
    legalComments: 'none',
    logLevel: 'silent',
  })
}
