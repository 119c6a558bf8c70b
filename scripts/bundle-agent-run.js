#!/usr/bin/env node
// Bundles agent-run (dist/runtime/agent-run/main.js and everything it loads, both LLM SDKs
// included) into one CommonJS file, dist/agent-run.cjs, plus its V8 code cache and the list of
// packages it loads from node_modules (what an isolation image needs); bin/run.js loads them for
// `agent-run`. agent-run starts once per message: resolving and linking hundreds of small ESM
// files costs more than the run's own work. Of better-sqlite3 only the native addon stays outside,
// loaded by path next to its package. Run by `npm run build` after tsc (and by the test setup).
import esbuild from 'esbuild'
import path from 'node:path'
import {fileURLToPath} from 'node:url'
import {IMPORT_META_URL, finishBundle, selfWrapping} from './bundle-format.js'

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..')
const {
  AGENT_RUN_BUNDLE: outfile,
  writeAgentRunCodeCache,
  writeAgentRunPackages,
} = await import('../dist/runtime/agent-run/bundle.js')

const result = await esbuild.build({
  stdin: {
    contents: "export {main} from './runtime/agent-run/main.js'",
    resolveDir: path.join(root, 'dist'),
    sourcefile: 'agent-run-entry.js',
  },
  bundle: true,
  platform: 'node',
  format: 'cjs',
  target: 'node20',
  outfile,
  // better-sqlite3's JavaScript too: its addon is loaded by path (src/runtime/util/sqlite.ts)
  define: IMPORT_META_URL,
  // the format bin/cli-bundle.cjs loads (scripts/bundle-format.js); half the bytes to read at every run
  ...selfWrapping(),
  minifyWhitespace: true,
  minifySyntax: true,
  legalComments: 'none',
  logLevel: 'silent',
})
// A warning here is a bundle that misbehaves at run time (import.meta is empty in CommonJS, an
// unresolved require throws): fail the build instead of shipping it.
if (result.warnings.length > 0) {
  const messages = await esbuild.formatMessages(result.warnings, {kind: 'warning'})
  process.stderr.write(
    `bundle-agent-run: ${messages.join('\n')}\n  Try this: keep import.meta and dynamic require() out of agent-run's modules\n`,
  )
  process.exit(1)
}

finishBundle(outfile)
writeAgentRunCodeCache()
writeAgentRunPackages()
