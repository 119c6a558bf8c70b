#!/usr/bin/env node
// Criterion 10: what the host sandbox helper adds to one exec of /bin/true, against a bare exec and,
// when it is installed, Anthropic's sandbox-runtime (`srt`, bubblewrap-based) running the same
// command in the same run. Needs `npm run build` first (it uses dist/ and the built helper).
//
//   node bench/sandbox-exec.js [--runs 300] [--srt-runs 30] [--srt PATH] [--json]
//
// srt is not a dependency of the project: install it anywhere (for example
// `npm install --prefix /tmp/srt @anthropic-ai/sandbox-runtime`) and pass --srt, or set MEEPA_BENCH_SRT.
import {spawnSync} from 'node:child_process'
import fs from 'node:fs'
import os from 'node:os'
import path from 'node:path'
import {fileURLToPath} from 'node:url'

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..')
const args = process.argv.slice(2)
const option = (name, fallback) => {
  const index = args.indexOf(name)
  return index >= 0 && args[index + 1] ? args[index + 1] : fallback
}
const runs = Number(option('--runs', '300'))
const srtRuns = Number(option('--srt-runs', '30'))
const srt = option('--srt', process.env.MEEPA_BENCH_SRT ?? '/tmp/srt/node_modules/.bin/srt')
const asJson = args.includes('--json')

const helper = path.join(root, 'dist', 'native', 'meepa-sandbox')
if (!fs.existsSync(helper)) {
  console.error(`bench: ${helper} is missing; run \`npm run build\` first`)
  process.exit(1)
}
const {compilePolicy} = await import(path.join(root, 'dist', 'sandbox', 'policy.js'))
const {serializeRules} = await import(path.join(root, 'dist', 'sandbox', 'landlock', 'rules-file.js'))

// A realistic policy: the real baseline of this machine, a workspace, a private temp dir.
const scratch = fs.mkdtempSync(path.join(os.tmpdir(), 'meepa-bench-'))
const workspace = path.join(scratch, 'home', 'agents', 'bench')
const tmpDir = path.join(scratch, 'tmp')
fs.mkdirSync(workspace, {recursive: true})
fs.mkdirSync(tmpDir)
const policy = compilePolicy({
  fileAccess: {allow_read: [], allow_read_write: [], deny: [], allow_home_dotfiles: false, allow_network: false, best_effort: false},
  workspace,
  tmpDir,
  gatewayHome: path.join(scratch, 'home'),
  operatorHome: os.homedir(),
  otherWorkspaces: [],
  appRoot: root,
  nodeBinary: process.execPath,
})
const rulesFile = path.join(scratch, 'rules')
fs.writeFileSync(rulesFile, serializeRules(policy, {PATH: '/usr/bin:/bin', HOME: workspace, TMPDIR: tmpDir}))

const srtSettings = path.join(scratch, 'srt-settings.json')
fs.writeFileSync(srtSettings, JSON.stringify({network: {allowedDomains: [], deniedDomains: []}, filesystem: {denyRead: [path.join(os.homedir(), '.ssh')], allowWrite: [workspace], denyWrite: []}}))
const haveSrt = fs.existsSync(srt)

function timeOnce(file, argv, extraFd) {
  const fd = extraFd ? fs.openSync(rulesFile, 'r') : undefined
  const started = process.hrtime.bigint()
  const result = spawnSync(file, argv, {stdio: fd === undefined ? 'ignore' : ['ignore', 'ignore', 'pipe', fd], env: {PATH: '/usr/bin:/bin', HOME: scratch}, timeout: 60_000})
  const ms = Number(process.hrtime.bigint() - started) / 1e6
  if (fd !== undefined) fs.closeSync(fd)
  if (result.status !== 0) throw new Error(`${file} ${argv.join(' ')} exited ${result.status} ${result.signal} ${result.error?.message ?? ""}: ${String(result.stderr ?? '')}`)
  return ms
}

const cases = {
  bare: () => timeOnce('/bin/true', [], false),
  'meepa-sandbox': () => timeOnce(helper, ['--rules-fd', '3', '--', '/bin/true'], true),
  ...(haveSrt ? {srt: () => timeOnce(srt, ['-s', srtSettings, '/bin/true'], false)} : {}),
}
const samples = Object.fromEntries(Object.keys(cases).map((name) => [name, []]))
for (let warm = 0; warm < 10; warm++) for (const [name, run] of Object.entries(cases)) if (name !== 'srt' || warm < 2) run()
// interleaved, so drift on a shared machine hits every case alike
for (let index = 0; index < runs; index++) {
  for (const [name, run] of Object.entries(cases)) {
    if (name === 'srt' && index >= srtRuns) continue
    samples[name].push(run())
  }
}
fs.rmSync(scratch, {recursive: true, force: true})

const quantile = (values, q) => {
  const sorted = [...values].sort((a, b) => a - b)
  return sorted[Math.min(sorted.length - 1, Math.floor(q * sorted.length))]
}
const summary = Object.fromEntries(
  Object.entries(samples).map(([name, values]) => [name, {runs: values.length, median_ms: quantile(values, 0.5), p90_ms: quantile(values, 0.9), min_ms: Math.min(...values)}]),
)
const added = summary['meepa-sandbox'].median_ms - summary.bare.median_ms
const result = {
  machine: `${os.cpus().length} cpu ${os.cpus()[0]?.model ?? ''}, Linux ${os.release()}`,
  policy_rules: policy.rules.length,
  summary,
  meepa_added_median_ms: added,
  target_added_ms: 3,
  ...(haveSrt ? {srt_added_median_ms: summary.srt.median_ms - summary.bare.median_ms, srt_over_meepa_ratio: summary.srt.median_ms / summary['meepa-sandbox'].median_ms} : {srt: `not found at ${srt}`}),
}
if (asJson) console.log(JSON.stringify(result, null, 2))
else {
  console.log(`machine: ${result.machine}; policy: ${result.policy_rules} Landlock rules`)
  for (const [name, stats] of Object.entries(summary)) {
    console.log(`${name.padEnd(14)} median ${stats.median_ms.toFixed(2)} ms  p90 ${stats.p90_ms.toFixed(2)} ms  min ${stats.min_ms.toFixed(2)} ms  (${stats.runs} runs)`)
  }
  console.log(`meepa-sandbox adds ${added.toFixed(2)} ms per exec (median; target < 3 ms)`)
  if (haveSrt) console.log(`srt adds ${result.srt_added_median_ms.toFixed(2)} ms; srt/meepa-sandbox = ${result.srt_over_meepa_ratio.toFixed(1)}x`)
  else console.log(result.srt)
}
