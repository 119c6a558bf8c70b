#!/usr/bin/env node
// agent-run is started once per message: skip oclif's plugin loading so start-up stays small.
if (process.argv[2] === 'agent-run' && process.argv.length === 3) {
  const {main} = await import('../dist/runtime/agent-run/main.js')
  await main()
} else {
  const {execute} = await import('@oclif/core')
  await execute({dir: import.meta.url})
}
