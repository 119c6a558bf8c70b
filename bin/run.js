#!/usr/bin/env node
// Hot paths skip oclif's config and plugin loading: agent-run starts once per message, and
// `--version` is what scripts and health checks call. Everything else runs the CLI bundle
// (dist/cli.cjs, one file with a code cache) through oclif, reading oclif.manifest.json, but for
// the few commands src/cli/fast-paths.ts runs without it.
const [command, ...rest] = process.argv.slice(2)
if (command === 'agent-run' && rest.length === 0) {
  const {loadAgentRun} = await import('../dist/runtime/agent-run/bundle.js')
  await loadAgentRun().main()
} else if (command === '--version' && rest.length === 0) {
  const {readFileSync} = await import('node:fs')
  const {version} = JSON.parse(readFileSync(new URL('../package.json', import.meta.url), 'utf8'))
  // the same line oclif prints
  process.stdout.write(`meepagateway/${version} ${process.platform}-${process.arch} node-${process.version}\n`)
} else {
  const {fileURLToPath} = await import('node:url')
  const {createRequire} = await import('node:module')
  // require, not import(): importing CommonJS from ESM runs Node's export lexer (≈ 10 ms of WebAssembly set-up)
  const {loadCliBundle} = createRequire(import.meta.url)('./cli-bundle.cjs')
  const root = fileURLToPath(new URL('..', import.meta.url))
  const cli = loadCliBundle(root).exports
  // `sandbox exec -- CMD` with plain flags runs without oclif; undefined: oclif takes the argv
  const exitCode = command === 'sandbox' && rest[0] === 'exec' ? await cli.fastPaths().sandboxExecWithoutOclif(rest.slice(1)) : undefined
  if (exitCode === undefined) {
    const oclif = cli.core()
    // Always the built commands, also under NODE_ENV=test/development: bin/dev.js runs src/.
    oclif.settings.enableAutoTranspile = false
    // No plugins to look for (each lookup is a file read before the command starts).
    await oclif.execute({loadOptions: {root, userPlugins: false, devPlugins: false}})
  } else {
    process.exitCode = exitCode
  }
}
