// What starting a child through execa (src/runtime/util/subprocess.ts) costs against
// node:child_process's spawn, per child, in the parent: CPU (process.cpuUsage, which moves less
// with machine load than wall time) and wall time from the call to the child's close. The child is
// shaped as agent-run's own process (src/runtime/run-lifecycle/agent-run-process.ts): stdin,
// stdout, stderr and two extra pipes (its rules, the keeper's lifeline), detached, /bin/true.
// The two ways alternate, one of each per round, after a warm-up of each (execa loaded). Then
// what a fresh process pays for its first child (load and first call), each way as a CommonJS
// bundle (as the CLI and the runs ship), by the child's CPU from /usr/bin/time, BENCH_FRESH rounds.
//   npx tsx bench/subprocess.ts        (BENCH_N=200 rounds, BENCH_FRESH=20 by default)
import {build} from 'esbuild'
import {spawn, spawnSync} from 'node:child_process'
import fs from 'node:fs'
import os from 'node:os'
import path from 'node:path'
import {startSubprocess} from '../src/runtime/util/subprocess.js'
import {report, ROOT, stats} from './lib.js'

const N = Number(process.env.BENCH_N ?? 200)
const FRESH = Number(process.env.BENCH_FRESH ?? 20)
const STDIO = Array<'pipe'>(5).fill('pipe')

function viaSpawn(): Promise<void> {
  const child = spawn('/bin/true', [], {env: {}, detached: true, stdio: STDIO})
  for (const stream of child.stdio) stream?.on('error', () => {})
  ;(child.stdio[3] as NodeJS.WritableStream).end('rules')
  return new Promise((resolve) => child.once('close', () => resolve()))
}

async function viaExeca(): Promise<void> {
  const child = startSubprocess('/bin/true', [], {
    env: {},
    detached: true,
    stdio: STDIO,
    buffer: {stdout: false, stderr: false},
  })
  ;(child.stdio[3] as NodeJS.WritableStream).end('rules')
  await child
}

async function measure(run: () => Promise<void>): Promise<{cpu: number; wall: number}> {
  const [cpu, wall] = [process.cpuUsage(), performance.now()]
  await run()
  const used = process.cpuUsage(cpu)
  return {cpu: (used.user + used.system) / 1000, wall: performance.now() - wall}
}

for (let i = 0; i < 10; i++) await Promise.all([viaSpawn(), viaExeca()])
const samples = {spawn: [] as Array<{cpu: number; wall: number}>, execa: [] as Array<{cpu: number; wall: number}>}
for (let round = 0; round < N; round++) {
  const order = round % 2 === 0 ? (['spawn', 'execa'] as const) : (['execa', 'spawn'] as const)
  for (const way of order) samples[way].push(await measure(way === 'spawn' ? viaSpawn : viaExeca))
}
const summary = (way: 'spawn' | 'execa') => ({
  cpu_ms: stats(samples[way].map((s) => s.cpu)),
  wall_ms: stats(samples[way].map((s) => s.wall)),
})
const [bare, execa] = [summary('spawn'), summary('execa')]
// a fresh process: one child, then exit
const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'meepa-bench-subprocess-'))
const bundles = {
  spawn:
    "const {spawn} = require('node:child_process'); const c = spawn('/bin/true', [], {env: {}, detached: true, stdio: Array(5).fill('pipe')}); for (const s of c.stdio) s.on('error', () => {}); c.stdio[3].end('rules'); c.on('close', () => {})",
  execa: `const {startSubprocess} = require(${JSON.stringify(path.join(ROOT, 'src', 'runtime', 'util', 'subprocess.ts'))}); const c = startSubprocess('/bin/true', [], {env: {}, detached: true, stdio: Array(5).fill('pipe'), buffer: {stdout: false, stderr: false}}); c.stdio[3].end('rules'); c.then(() => {})`,
}
for (const [way, contents] of Object.entries(bundles)) {
  await build({
    stdin: {contents, resolveDir: ROOT, sourcefile: `${way}.js`},
    bundle: true,
    platform: 'node',
    format: 'cjs',
    target: 'node20',
    outfile: path.join(dir, `${way}.cjs`),
    logLevel: 'silent',
  })
}
const freshCpu = {spawn: [] as number[], execa: [] as number[]}
for (let round = 0; round < FRESH + 2; round++) {
  for (const way of round % 2 === 0 ? (['spawn', 'execa'] as const) : (['execa', 'spawn'] as const)) {
    const timed = spawnSync('/usr/bin/time', ['-f', '%U %S', process.execPath, path.join(dir, `${way}.cjs`)], {
      encoding: 'utf8',
      stdio: ['ignore', 'ignore', 'pipe'],
    })
    if (timed.status !== 0) throw new Error(`bench/subprocess: the ${way} child failed: ${timed.stderr}`)
    const [user = 0, system = 0] = (timed.stderr.trim().split('\n').at(-1) ?? '').split(' ').map(Number)
    if (round >= 2) freshCpu[way].push((user + system) * 1000)
  }
}
fs.rmSync(dir, {recursive: true, force: true})
const fresh = {spawn: stats(freshCpu.spawn), execa: stats(freshCpu.execa)}
report('subprocess', {
  fresh_process_cpu_ms: fresh,
  fresh_added_cpu_ms_median: Number((fresh.execa.median - fresh.spawn.median).toFixed(1)),
  rounds: N,
  spawn: bare,
  execa,
  added_cpu_ms_median: Number((execa.cpu_ms.median - bare.cpu_ms.median).toFixed(3)),
  added_wall_ms_median: Number((execa.wall_ms.median - bare.wall_ms.median).toFixed(3)),
  cpu_ratio_median: Number((execa.cpu_ms.median / bare.cpu_ms.median).toFixed(2)),
})
