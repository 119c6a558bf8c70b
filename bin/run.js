#!/bin/sh
':' //; unset MEEPAGATEWAY_DEFERRED_EXTRA_CA_CERTS; case "${1-}" in sandbox|config|agent|runs|audit|api-key|container|help|--help|-h|--version) if [ -n "${NODE_EXTRA_CA_CERTS-}" ]; then export MEEPAGATEWAY_DEFERRED_EXTRA_CA_CERTS="$NODE_EXTRA_CA_CERTS"; unset NODE_EXTRA_CA_CERTS; fi ;; esac
':' //; exec node "$0" ${1+"$@"}
'use strict'
// The lines above are sh (this file runs through its #! line) and, to Node, string statements
// and a comment. Node 20 parses every certificate NODE_EXTRA_CA_CERTS names as it starts (≈ 35 ms
// for a system bundle), though only a TLS connection reads them. The commands named there open
// none (SQLite, the sandbox, the local Docker socket or the docker CLI), so sh hands the variable
// over under another name, and this puts it back for whatever the command starts.
if (process.env.MEEPAGATEWAY_DEFERRED_EXTRA_CA_CERTS !== undefined) {
  process.env.NODE_EXTRA_CA_CERTS ??= process.env.MEEPAGATEWAY_DEFERRED_EXTRA_CA_CERTS
  delete process.env.MEEPAGATEWAY_DEFERRED_EXTRA_CA_CERTS
}
// CommonJS (bin/package.json): an ES module entry costs Node ≈ 5 ms of loader set-up at every start.
// Hot paths skip oclif's config and plugin loading: agent-run starts once per message, and
// `--version` is what scripts and health checks call. The most used commands and help pages run
// from small bundles without oclif (dist/lite/); everything else runs the CLI bundle (dist/cli.cjs,
// one file with a code cache) through oclif, reading oclif.manifest.json.
const path = require('node:path')

const root = path.join(__dirname, '..')
const argv = process.argv.slice(2)

async function main() {
  if (argv[0] === 'agent-run' && argv.length === 1) {
    await require('./agent-run.cjs').loadAgentRun().exports.main()
    return
  }
  if (argv[0] === '--version' && argv.length === 1) {
    const {version} = require('../package.json')
    // the same line oclif prints
    process.stdout.write(`meepagateway/${version} ${process.platform}-${process.arch} node-${process.version}\n`)
    return
  }
  const {liteBundleFor, loadCliBundle} = require('./cli-bundle.cjs')
  // The most used commands and help pages run from small bundles without oclif (src/cli/lite/);
  // undefined: this argv is oclif's
  const lite = liteBundleFor(root, argv)
  const exitCode = lite === undefined ? undefined : await loadCliBundle(root, {bundle: lite}).exports.run(argv, root)
  if (exitCode !== undefined) {
    process.exitCode = exitCode
    return
  }
  const oclif = loadCliBundle(root).exports.core()
  // Always the built commands, also under NODE_ENV=test/development: bin/dev.js runs src/.
  oclif.settings.enableAutoTranspile = false
  // No plugins to look for (each lookup is a file read before the command starts).
  await oclif.execute({loadOptions: {root, userPlugins: false, devPlugins: false}})
}

main().catch((error) => {
  // what an unhandled rejection of the ES module entry printed: the stack, exit 1
  process.exitCode = 1
  console.error(error)
})
