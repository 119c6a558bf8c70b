#!/usr/bin/env node
// What the host sandbox adds to one exec of /bin/true, in the same run against a bare exec and
// Anthropic's sandbox-runtime (`srt`, bubblewrap-based): the helper alone (Landlock + seccomp, the
// fallback without namespaces) and bubblewrap's namespaces + the helper (the default where user
// namespaces work). Needs `npm run build` first (it uses dist/ and the built helper).
//
//   node bench/sandbox-exec.js [--runs 300] [--srt-runs 30] [--srt PATH] [--json]
//
// srt is a pinned dev dependency (@anthropic-ai/sandbox-runtime); --srt or MEEPA_BENCH_SRT picks another.
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
const srt = option('--srt', process.env.MEEPA_BENCH_SRT ?? path.join(root, 'node_modules', '.bin', 'srt'))
const asJson = args.includes('--json')

const helper = path.join(root, 'dist', 'native', 'meepa-sandbox')
if (!fs.existsSync(helper)) {
  console.error(`bench: ${helper} is missing; run \`npm run build\` first`)
  process.exit(1)
}
const {compilePolicy} = await import(path.join(root, 'dist', 'sandbox', 'policy.js'))
const {serializeRules} = await import(path.join(root, 'dist', 'sandbox', 'landlock', 'rules-file.js'))
const {bwrapArgv, probeNamespaces} = await import(path.join(root, 'dist', 'sandbox', 'bwrap', 'namespaces.js'))

// A realistic policy: the real baseline of this machine, a workspace, a private temp dir.
const scratch = fs.mkdtempSync(path.join(os.tmpdir(), 'meepa-bench-'))
const workspace = path.join(scratch, 'home', 'agents', 'bench')
const tmpDir = path.join(scratch, 'tmp')
fs.mkdirSync(workspace, {recursive: true})
fs.mkdirSync(tmpDir)
// one deny inside the workspace: what the namespace layer covers (and the fallback lowers)
fs.mkdirSync(path.join(workspace, 'private'))
const compile = (namespaces) =>
  compilePolicy({
    fileAccess: {
      allow_read: [],
      allow_read_write: [],
      deny: ['private'],
      allow_home_dotfiles: false,
      allow_network: false,
      best_effort: false,
    },
    workspace,
    tmpDir,
    gatewayHome: path.join(scratch, 'home'),
    operatorHome: os.homedir(),
    otherWorkspaces: [],
    appRoot: root,
    nodeBinary: process.execPath,
    namespaces,
  })
const env = {PATH: '/usr/bin:/bin', HOME: workspace, TMPDIR: tmpDir}
const policy = compile(false)
const rulesFile = path.join(scratch, 'rules')
fs.writeFileSync(rulesFile, serializeRules(policy, env))
const namespaces = await probeNamespaces()
const nsPolicy = namespaces.available ? compile(true) : undefined
const nsRulesFile = path.join(scratch, 'rules-ns')
if (nsPolicy) fs.writeFileSync(nsRulesFile, serializeRules(nsPolicy, env))
const nsPrefix = nsPolicy ? bwrapArgv(namespaces.bwrap, nsPolicy, path.join(scratch, 'home')) : []

const srtSettings = path.join(scratch, 'srt-settings.json')
fs.writeFileSync(
  srtSettings,
  JSON.stringify({
    network: {allowedDomains: [], deniedDomains: []},
    filesystem: {denyRead: [path.join(os.homedir(), '.ssh')], allowWrite: [workspace], denyWrite: []},
  }),
)
const haveSrt = fs.existsSync(srt)

function timeOnce(file, argv, rules) {
  const fd = rules ? fs.openSync(rules, 'r') : undefined
  const started = process.hrtime.bigint()
  const result = spawnSync(file, argv, {
    stdio: fd === undefined ? 'ignore' : ['ignore', 'ignore', 'pipe', fd],
    env: {PATH: '/usr/bin:/bin', HOME: scratch},
    timeout: 60_000,
  })
  const ms = Number(process.hrtime.bigint() - started) / 1e6
  if (fd !== undefined) fs.closeSync(fd)
  if (result.status !== 0)
    throw new Error(
      `${file} ${argv.join(' ')} exited ${result.status} ${result.signal} ${result.error?.message ?? ''}: ${String(result.stderr ?? '')}`,
    )
  return ms
}

const cases = {
  bare: () => timeOnce('/bin/true', [], undefined),
  'meepa-sandbox': () => timeOnce(helper, ['--rules-fd', '3', '--', '/bin/true'], rulesFile),
  ...(nsPolicy
    ? {
        'bwrap+meepa': () =>
          timeOnce(nsPrefix[0], [...nsPrefix.slice(1), helper, '--rules-fd', '3', '--', '/bin/true'], nsRulesFile),
      }
    : {}),
  ...(haveSrt ? {srt: () => timeOnce(srt, ['-s', srtSettings, '/bin/true'], undefined)} : {}),
}
const samples = Object.fromEntries(Object.keys(cases).map((name) => [name, []]))
for (let warm = 0; warm < 10; warm++)
  for (const [name, run] of Object.entries(cases)) if (name !== 'srt' || warm < 2) run()
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
  Object.entries(samples).map(([name, values]) => [
    name,
    {runs: values.length, median_ms: quantile(values, 0.5), p90_ms: quantile(values, 0.9), min_ms: Math.min(...values)},
  ]),
)
const added = summary['meepa-sandbox'].median_ms - summary.bare.median_ms
const nsAdded = nsPolicy ? summary['bwrap+meepa'].median_ms - summary.bare.median_ms : undefined
const result = {
  machine: `${os.cpus().length} cpu ${os.cpus()[0]?.model ?? ''}, Linux ${os.release()}`,
  policy_rules: policy.rules.length,
  namespace_policy_rules: nsPolicy?.rules.length,
  summary,
  meepa_added_median_ms: added,
  target_added_ms: 3,
  ...(nsPolicy
    ? {namespaces_added_median_ms: nsAdded, namespaces_target_added_ms: 10}
    : {namespaces: `unavailable: ${namespaces.reason}`}),
  ...(haveSrt
    ? {
        srt_added_median_ms: summary.srt.median_ms - summary.bare.median_ms,
        srt_over_meepa_ratio: summary.srt.median_ms / summary['meepa-sandbox'].median_ms,
      }
    : {srt: `not found at ${srt}`}),
}
if (asJson) console.log(JSON.stringify(result, null, 2))
else {
  console.log(
    `machine: ${result.machine}; policy: ${result.policy_rules} Landlock rules (${result.namespace_policy_rules ?? '-'} with namespaces)`,
  )
  for (const [name, stats] of Object.entries(summary)) {
    console.log(
      `${name.padEnd(14)} median ${stats.median_ms.toFixed(2)} ms  p90 ${stats.p90_ms.toFixed(2)} ms  min ${stats.min_ms.toFixed(2)} ms  (${stats.runs} runs)`,
    )
  }
  console.log(`meepa-sandbox adds ${added.toFixed(2)} ms per exec (median; target < 3 ms)`)
  if (nsPolicy) console.log(`bwrap + meepa-sandbox adds ${nsAdded.toFixed(2)} ms per exec (median; target < 10 ms)`)
  else console.log(result.namespaces)
  if (haveSrt)
    console.log(
      `srt adds ${result.srt_added_median_ms.toFixed(2)} ms; srt/meepa-sandbox = ${result.srt_over_meepa_ratio.toFixed(1)}x`,
    )
  else console.log(result.srt)
}
