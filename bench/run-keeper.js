#!/usr/bin/env node
// What owning a run costs per exec of /bin/true: the keeper alone (fork, signalfd, the kill scan
// at the end), and the keeper with a cgroup per run (created with its limits, joined, killed,
// removed) where this host allows one -- against a bare exec in the same run.
// Then, with a cgroup per run, how long a Node command waits before it may get work: from the
// spawn to its first line of JavaScript and (with --join-while-starting) the keeper's 'J', the
// cgroups joined before exec vs while Node starts, against Node started bare. Runs are spaced
// (--pause-ms) as messages are: a cgroup v1 migration waits for an RCU grace period, which
// back-to-back runs share and a lone run does not.
// Needs `npm run build` first (it uses dist/ and the built helper).
//
//   node bench/run-keeper.js [--runs 200] [--starts 25] [--pause-ms 200] [--json]
import {spawn, spawnSync} from 'node:child_process'
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
const {cgroupSupport, createRunCgroup, killRunCgroups, removeRunCgroups} = await import(
  path.join(root, 'dist', 'sandbox', 'run-cgroup.js')
)
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
          const cgroup = createRunCgroup(`bench_${process.pid}_${serial++}`, {
            memoryBytes: 512 * 1024 ** 2,
            pids: 256,
            cpus: 1,
          })
          exec(helper, ['--keeper-fd', '3', ...cgroup.dirs.flatMap((dir) => ['--cgroup', dir]), '--', '/bin/true'])
          killRunCgroups(cgroup.dirs)
          removeRunCgroups(cgroup.dirs)
        },
      }),
}
const samples = Object.fromEntries(Object.keys(cases).map((name) => [name, []]))
for (let warm = 0; warm < 10; warm++) for (const run of Object.values(cases)) run()
for (let index = 0; index < runs; index++)
  for (const [name, run] of Object.entries(cases)) samples[name].push(time(run))
const median = (values) => [...values].sort((a, b) => a - b)[Math.floor(values.length / 2)]
const bare = median(samples.bare)
const results = Object.fromEntries(
  Object.entries(samples).map(([name, values]) => [
    name,
    {median_ms: median(values), added_ms: median(values) - bare, ratio: median(values) / bare},
  ]),
)

const starts = Number(args.includes('--starts') ? args[args.indexOf('--starts') + 1] : '25')
const pauseMs = Number(args.includes('--pause-ms') ? args[args.indexOf('--pause-ms') + 1] : '200')
const firstLine = 'process.stdout.write(String(performance.timeOrigin + performance.now()))'
/** ms from spawn until the command may get work: its first line ran and, when asked, the keeper said 'J'. */
function startOnce(argv, joinByte) {
  return new Promise((resolve, reject) => {
    const spawned = performance.timeOrigin + performance.now()
    const child = spawn(argv[0], argv.slice(1), {
      stdio: ['ignore', 'pipe', 'pipe', 'pipe'],
      env: {PATH: '/usr/bin:/bin'},
    })
    let line = ''
    let joined = joinByte ? undefined : spawned
    child.stdout.on('data', (chunk) => (line += chunk))
    child.stdio[3].on('data', (chunk) => {
      if (chunk.includes(0x4a)) joined ??= performance.timeOrigin + performance.now()
    })
    child.on('error', reject)
    child.on('close', (code) =>
      code === 0 && joined !== undefined
        ? resolve(Math.max(Number(line), joined) - spawned)
        : reject(new Error(`${argv.join(' ')} exited ${code}`)),
    )
  })
}
const startCases =
  support.mode === 'none'
    ? {}
    : {
        'node, bare': async () => startOnce([process.execPath, '-e', firstLine], false),
        'node, cgroups joined before exec': async () =>
          withCgroup((flags) =>
            startOnce([helper, '--keeper-fd', '3', ...flags, '--', process.execPath, '-e', firstLine], false),
          ),
        'node, cgroups joined while it starts': async () =>
          withCgroup((flags) =>
            startOnce(
              [helper, '--keeper-fd', '3', ...flags, '--join-while-starting', '--', process.execPath, '-e', firstLine],
              true,
            ),
          ),
      }
async function withCgroup(use) {
  const cgroup = createRunCgroup(`bench_${process.pid}_${serial++}`, {memoryBytes: 512 * 1024 ** 2, pids: 256, cpus: 1})
  try {
    return await use(cgroup.dirs.flatMap((dir) => ['--cgroup', dir]))
  } finally {
    killRunCgroups(cgroup.dirs)
    removeRunCgroups(cgroup.dirs)
  }
}
const startSamples = Object.fromEntries(Object.keys(startCases).map((name) => [name, []]))
for (let index = 0; index < starts + 2; index++) {
  for (const [name, run] of Object.entries(startCases)) {
    await new Promise((resolve) => setTimeout(resolve, pauseMs))
    const ms = await run()
    if (index >= 2) startSamples[name].push(ms)
  }
}
const nodeBare = startSamples['node, bare']?.length ? median(startSamples['node, bare']) : undefined
const startResults = Object.fromEntries(
  Object.entries(startSamples).map(([name, values]) => [
    name,
    {median_ms: median(values), added_ms: median(values) - nodeBare, ratio: median(values) / nodeBare},
  ]),
)

fs.mkdirSync(path.join(root, 'bench', 'results'), {recursive: true})
fs.writeFileSync(
  path.join(root, 'bench', 'results', 'run-keeper.json'),
  JSON.stringify(
    {runs, starts, pause_ms: pauseMs, cgroups: support.how, results, until_node_may_work: startResults},
    null,
    2,
  ),
)
if (args.includes('--json')) console.log(JSON.stringify({results, until_node_may_work: startResults}))
else {
  console.log(`cgroups: ${support.how}`)
  for (const [name, result] of Object.entries(results))
    console.log(
      `${name.padEnd(16)} ${result.median_ms.toFixed(2)} ms  (+${result.added_ms.toFixed(2)} ms, ${result.ratio.toFixed(2)}x bare)`,
    )
  if (nodeBare !== undefined) console.log(`until Node may get work (${starts} starts, ${pauseMs} ms apart):`)
  for (const [name, result] of Object.entries(startResults))
    console.log(
      `  ${name.padEnd(38)} ${result.median_ms.toFixed(2)} ms  (+${result.added_ms.toFixed(2)} ms, ${result.ratio.toFixed(2)}x bare)`,
    )
}
