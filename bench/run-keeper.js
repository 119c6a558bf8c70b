#!/usr/bin/env node
// What owning a run costs per exec of /bin/true: the keeper alone (fork, signalfd, the kill scan
// at the end), and the keeper with a cgroup per run (created with its limits, joined, killed,
// removed) where this host allows one -- against a bare exec in the same run.
// Needs `npm run build` first (it uses dist/ and the built helper).
//
//   node bench/run-keeper.js [--runs 200] [--json]
import {spawnSync} from 'node:child_process'
import fs from 'node:fs'
import path from 'node:path'
import {fileURLToPath} from 'node:url'

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..')
const args = process.argv.slice(2)
const runs = Number(args.includes('--runs') ? args[args.indexOf('--runs') + 1] : '200')
const helper = path.join(root, 'dist', 'native', 'meepa-sandbox')
if (!fs.existsSync(helper)) {
  console.error(`bench: ${helper} is missing; run \`npm run build\` first`)
  process.exit(1)
}
const {cgroupSupport, createRunCgroup, killRunCgroups, removeRunCgroups} = await import(path.join(root, 'dist', 'sandbox', 'run-cgroup.js'))
const support = cgroupSupport()

function time(run) {
  const started = process.hrtime.bigint()
  run()
  return Number(process.hrtime.bigint() - started) / 1e6
}
function exec(file, argv) {
  // fd 3 stays open in this process for the whole exec: the keeper's lifeline
  const result = spawnSync(file, argv, {stdio: ['ignore', 'ignore', 'pipe', 'pipe'], env: {PATH: '/usr/bin:/bin'}})
  if (result.status !== 0) throw new Error(`${file} exited ${result.status}: ${String(result.stderr)}`)
}
let serial = 0
const cases = {
  bare: () => exec('/bin/true', []),
  keeper: () => exec(helper, ['--keeper-fd', '3', '--', '/bin/true']),
  ...(support.mode === 'none'
    ? {}
    : {
        'keeper + cgroup': () => {
          const cgroup = createRunCgroup(`bench_${process.pid}_${serial++}`, {memoryBytes: 512 * 1024 ** 2, pids: 256, cpus: 1})
          exec(helper, ['--keeper-fd', '3', ...cgroup.dirs.flatMap((dir) => ['--cgroup', dir]), '--', '/bin/true'])
          killRunCgroups(cgroup.dirs)
          removeRunCgroups(cgroup.dirs)
        },
      }),
}
const samples = Object.fromEntries(Object.keys(cases).map((name) => [name, []]))
for (let warm = 0; warm < 10; warm++) for (const run of Object.values(cases)) run()
for (let index = 0; index < runs; index++) for (const [name, run] of Object.entries(cases)) samples[name].push(time(run))
const median = (values) => [...values].sort((a, b) => a - b)[Math.floor(values.length / 2)]
const bare = median(samples.bare)
const results = Object.fromEntries(Object.entries(samples).map(([name, values]) => [name, {median_ms: median(values), added_ms: median(values) - bare, ratio: median(values) / bare}]))
fs.mkdirSync(path.join(root, 'bench', 'results'), {recursive: true})
fs.writeFileSync(path.join(root, 'bench', 'results', 'run-keeper.json'), JSON.stringify({runs, cgroups: support.how, results}, null, 2))
if (args.includes('--json')) console.log(JSON.stringify(results))
else {
  console.log(`cgroups: ${support.how}`)
  for (const [name, result] of Object.entries(results)) console.log(`${name.padEnd(16)} ${result.median_ms.toFixed(2)} ms  (+${result.added_ms.toFixed(2)} ms, ${result.ratio.toFixed(2)}x bare)`)
}
