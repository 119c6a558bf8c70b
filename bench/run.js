#!/usr/bin/env node
// The benchmark suite: `npm run bench` lists the benchmarks with what each measures; `npm run
// bench -- NAME [ARGS...]` runs one (a .ts through tsx, a .js with node), its arguments passed on.
// Each writes its figures to bench/results/NAME.json; BENCHMARKS.md holds the current ones.
import {spawnSync} from 'node:child_process'
import fs from 'node:fs'
import path from 'node:path'
import {fileURLToPath} from 'node:url'

const benchDir = path.dirname(fileURLToPath(import.meta.url))
const root = path.dirname(benchDir)
/** Every benchmark, by name: what it measures (its opening comment has the targets and options). */
const SUITE = {
  startup: 'CLI start-up of every command, each as a ratio to `node -e 0` in the same run (issues 2, 13)',
  'light-commands':
    'the work of `config check`, `agent list` and `runs` after the CLI has started (needs npm run build)',
  'sandbox-exec':
    'what the host sandbox adds to one exec of /bin/true, against a bare exec and `srt` (needs npm run build)',
  'run-keeper':
    'what owning a run costs per exec: the keeper, and the keeper with a cgroup per run (needs npm run build)',
  subprocess:
    "what a child started through execa costs the parent against node:child_process's spawn, shaped as agent-run's process",
  'llm-channel': 'per LLM call, agent-run asking its runner against calling the provider itself (issue 11)',
  'container-overhead': 'container mode, send to reply with a fake LLM, against a bare `docker run` (issue 4; Docker)',
  'container-network-none':
    'a `network: none` container created with no network stack (Engine API, NetworkDisabled) against `docker run --network none`, CPU and wall per container (issue 25; Docker)',
  'container-cold-network':
    'a cold container message with `network: none` against `network: host` before issue 11 (ARGS: a built checkout of the previous commit; Docker)',
  'gateway-webchat':
    '20 agents x 5 messages through the web chat of a real `serve`, against `runMessage` directly (issue 5)',
  'attachment-inbound':
    'a message with one 1 MB attachment in a running gateway, against the same message without it (issue 23)',
  'warm-levels':
    'a web-chat message through `serve` with standbys, unrestricted / host sandbox / container side by side (issue 25)',
  'remote-engine':
    'a container message on a remote engine (mutual TLS, and ssh://, loopback) against the local engine, unchanged 50 MB workspace, cold and with standbys (issue 24; Docker, root, sshd)',
  'engine-placement':
    'what placing a run among 16 engines costs per message, against the local engine alone (issue 24)',
  'workspace-handover':
    "/healthz and another agent's job while a root gateway hands a hostile 300,000-file workspace over (issue 27; root)",
}

/** The suite's files; a benchmark file the suite does not name is an error, so the list stays whole. */
function benchmarks() {
  const files = fs
    .readdirSync(benchDir)
    .filter((file) => /\.(ts|js)$/.test(file) && !['lib.ts', 'run.js'].includes(file))
  const unlisted = files.filter((file) => !(file.replace(/\.(ts|js)$/, '') in SUITE))
  if (unlisted.length > 0) throw new Error(`bench/run.js: add ${unlisted.join(', ')} to SUITE`)
  return files.map((file) => ({
    name: file.replace(/\.(ts|js)$/, ''),
    file,
    about: SUITE[file.replace(/\.(ts|js)$/, '')],
  }))
}

const [name, ...args] = process.argv.slice(2)
const all = benchmarks().sort((a, b) => Object.keys(SUITE).indexOf(a.name) - Object.keys(SUITE).indexOf(b.name))
if (!name || name === '--help' || name === '-h') {
  console.log('usage: npm run bench -- NAME [ARGS...]   (each writes bench/results/NAME.json)\n')
  const width = Math.max(...all.map((bench) => bench.name.length))
  for (const bench of all) console.log(`  ${bench.name.padEnd(width)}  ${bench.about}`)
  process.exit(0)
}
const bench = all.find((candidate) => candidate.name === name || candidate.file === name)
if (!bench) {
  console.error(
    `bench: no benchmark named ${name}; run \`npm run bench\` to list them (${all.map((candidate) => candidate.name).join(', ')})`,
  )
  process.exit(2)
}
const file = path.join(benchDir, bench.file)
const command = bench.file.endsWith('.ts')
  ? [path.join(root, 'node_modules', 'tsx', 'dist', 'cli.mjs'), file, ...args]
  : [file, ...args]
const result = spawnSync(process.execPath, command, {cwd: root, stdio: 'inherit'})
if (result.error) throw result.error
process.exit(result.status ?? 1)
