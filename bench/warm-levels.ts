// Issue 25, criterion 3: a web-chat message to a fake LLM that answers at once, through a real
// `serve`, at the three isolation levels side by side in one gateway (10 agents per level), every
// message after the first of each agent served by a standby. Messages go one at a time, levels
// interleaved (the machine's load weighs on each the same), agents in turn.
//
// Targets: host sandbox ≤ 1.2× unrestricted, container (standby) ≤ 1.5× unrestricted, and at
// every level the gateway's own time per message ≤ 50 ms p50 and ≤ 150 ms p99 over 200 messages
// to 10 agents. The gateway's own time is the request's arrival to the reply's last byte minus
// the provider's time: here each message's time as this client sees it (an upper bound) minus the
// time the fake LLM spent on the requests it served meanwhile. Also counted: the processes `serve`
// starts per message (a preload counts every ChildProcess spawn). Container agents are measured
// when a Docker engine answers.
//
//   npx tsx bench/warm-levels.ts        (BENCH_MESSAGES: messages per level, default 200)
//   BENCH_LEVELS: a comma-separated subset of the levels (default all three)
//   BENCH_GAP_MS: a pause after each message (default 0, back to back)
//   BENCH_PROFILE=1: serve runs with --cpu-prof; the gateway's hottest functions are printed
import {execa, type ResultPromise} from 'execa'
import fs from 'node:fs'
import os from 'node:os'
import path from 'node:path'
import {startFakeLlm} from '../test/fakes/llm-server.js'
import {freePort} from '../test/helpers/free-port.js'
import {fakeLlmHome, removeHome, report, ROOT} from './lib.js'

const MESSAGES = Number(process.env.BENCH_MESSAGES ?? 200)
const AGENTS = 10
// a pause after each message: lets the standby it starts get ready before the next one comes
const GAP_MS = Number(process.env.BENCH_GAP_MS ?? 0)
const bin = path.join(ROOT, 'bin', 'run.js')
const env = {FAKE_LLM_KEY: 'sk-bench', PATH: process.env.PATH ?? '/usr/bin:/bin'}

const dockerUp = (await execa('docker', ['version', '--format', '{{.Server.Version}}'], {reject: false})).exitCode === 0
const levels = {
  unrestricted: {file_access: {unrestricted: true}},
  'host-sandbox': {},
  ...(dockerUp ? {container: {container_mode: {enabled: true, network: 'none'}}} : {}),
} as Record<string, Record<string, unknown>>
// BENCH_LEVELS=unrestricted,host-sandbox: only those
for (const level of Object.keys(levels))
  if (process.env.BENCH_LEVELS && !process.env.BENCH_LEVELS.split(',').includes(level)) delete levels[level]
const agentId = (level: string, index: number) => `${level.slice(0, 1)}${String(index + 1).padStart(2, '0')}`

const llm = await startFakeLlm()
llm.setDefault({text: 'ok'})
const port = await freePort()
const {home, configPath} = fakeLlmHome('meepa-bench-warm-', llm.openaiBaseUrl, {
  captain: {enabled: true, bind: '127.0.0.1', port},
  // one standby per agent: the budget must not be what is measured
  gateway: {max_standbys: AGENTS * Object.keys(levels).length},
  agents: Object.entries(levels).flatMap(([level, fields]) =>
    Array.from({length: AGENTS}, (_, i) => ({id: agentId(level, i), ...fields})),
  ),
})
const spawnLog = path.join(home, 'spawns.json')
const serveEnv = {...env, MEEPAGATEWAY_HOME: home, BENCH_SPAWN_LOG: spawnLog}
// Every child `serve` starts, with when (ms since the epoch, sub-ms), written as it exits.
const countSpawns = path.join(home, 'count-spawns.cjs')
fs.writeFileSync(
  countSpawns,
  `const {ChildProcess} = require('node:child_process')
const spawned = []
const spawn = ChildProcess.prototype.spawn
ChildProcess.prototype.spawn = function (options) {
  spawned.push([performance.timeOrigin + performance.now(), [require('node:path').basename(options.file), ...options.args.slice(1, 2)].join(' ')])
  return spawn.call(this, options)
}
process.on('exit', () => require('node:fs').writeFileSync(process.env.BENCH_SPAWN_LOG, JSON.stringify(spawned)))
`,
)
const key = JSON.parse(
  (await execa(process.execPath, [bin, 'api-key', 'create', 'bench', '--json'], {env: serveEnv})).stdout,
).key as string
const profileDir = path.join(home, 'profile')
const serve: ResultPromise = execa(
  process.execPath,
  [
    ...(process.env.BENCH_PROFILE ? ['--cpu-prof', `--cpu-prof-dir=${profileDir}`] : []),
    '--require',
    countSpawns,
    bin,
    'serve',
    '--config',
    configPath,
  ],
  {env: serveEnv, reject: false},
)
let output = ''
serve.stdout?.on('data', (chunk) => (output += String(chunk)))
serve.stderr?.on('data', (chunk) => (output += String(chunk)))
while (!output.includes('listening on')) {
  if (serve.exitCode !== null) throw new Error(`serve exited:\n${output}`)
  await new Promise((resolve) => setTimeout(resolve, 50))
}

/** Each message's window (performance.now() of this process, the fake LLM's clock too). */
const windows: Array<{level: string; sent: number; done: number}> = []

/**
 * A message that failed (logged and counted, not a sample): on a shared machine another user's
 * container may go away while bubblewrap binds the mounts it listed, which fails that cold run.
 */
const failures: string[] = []

/** One web-chat message; the time to the reply's last byte (undefined: it failed). */
async function send(agent: string, channel: string, level?: string): Promise<number | undefined> {
  const started = performance.now()
  const response = await fetch(`http://127.0.0.1:${port}/api/chat`, {
    method: 'POST',
    headers: {authorization: `Bearer ${key}`, 'content-type': 'application/json'},
    body: JSON.stringify({agent, message: 'hi', channel}),
  })
  const body = await response.text()
  const ms = performance.now() - started
  if (response.status !== 200) {
    const run = /"run_id":"(run_\w+)"/.exec(body)?.[1] ?? 'no run'
    failures.push(
      `${agent}: ${response.status} ${output
        .split('\n')
        .filter((line) => line.includes(run))
        .join(' | ')}`,
    )
    return undefined
  }
  if (level) windows.push({level, sent: started, done: started + ms})
  return ms
}

// each agent's first message is cold and starts its standby; then the standbys have time to start
const cold: Record<string, number[]> = {}
for (const level of Object.keys(levels))
  for (let i = 0; i < AGENTS; i++) {
    const ms = await send(agentId(level, i), 'warm-up')
    if (ms !== undefined) (cold[level] ??= []).push(ms)
  }
await new Promise((resolve) => setTimeout(resolve, 5000))

const samples: Record<string, number[]> = Object.fromEntries(Object.keys(levels).map((level) => [level, []]))
// the profile's clock (CLOCK_MONOTONIC, µs): only what serve did for the measured messages is weighed
const measuredFrom = Number(process.hrtime.bigint() / 1000n)
for (let n = 0; n < MESSAGES; n++)
  for (const level of Object.keys(levels)) {
    const ms = await send(agentId(level, n % AGENTS), `bench-${n}`, level)
    if (ms !== undefined) samples[level]!.push(ms)
    if (GAP_MS > 0) await new Promise((resolve) => setTimeout(resolve, GAP_MS))
  }
const measuredTo = Number(process.hrtime.bigint() / 1000n)
const notUsed = output.match(/not using the standby agent-run prepared for this agent: .*/g) ?? []
const coldLines = notUsed.length
const coldReasons = [...new Set(notUsed.map((line) => line.replace(/\d+/g, 'N').slice(0, 200)))].slice(0, 5)
const healthz = (await (await fetch(`http://127.0.0.1:${port}/healthz`)).json()) as {standbys: unknown}

serve.kill('SIGTERM')
await serve
await llm.close()

// own time: each message's minus what the fake LLM spent answering within it, and where it goes:
// before the first provider request, and after the last answer
const own: Record<string, number[]> = {}
const split: Record<string, {before: number[]; after: number[]}> = {}
for (const {level, sent, done} of windows) {
  const served = llm.served.filter((answer) => answer.receivedMs >= sent && answer.answeredMs <= done)
  const provider = served.reduce((sum, answer) => sum + answer.answeredMs - answer.receivedMs, 0)
  ;(own[level] ??= []).push(done - sent - provider)
  if (served.length === 0) continue
  const parts = (split[level] ??= {before: [], after: []})
  parts.before.push(Math.min(...served.map((answer) => answer.receivedMs)) - sent)
  parts.after.push(done - Math.max(...served.map((answer) => answer.answeredMs)))
}
// processes started per message: each spawn counts for the message it follows (a standby is
// started once the reply is on its way, before the next message comes)
const spawns = JSON.parse(fs.readFileSync(spawnLog, 'utf8')) as Array<[number, string]>
const spawnsPer: Record<string, Record<string, number>> = {}
windows.forEach(({level, sent}, i) => {
  const from = performance.timeOrigin + sent
  const to = i + 1 < windows.length ? performance.timeOrigin + windows[i + 1]!.sent : Infinity
  for (const [at, file] of spawns)
    if (at >= from && at < to) {
      const counts = (spawnsPer[level] ??= {})
      counts[file] = (counts[file] ?? 0) + 1 / MESSAGES
    }
})

const quantile = (values: number[], q: number) => {
  const sorted = [...values].sort((a, b) => a - b)
  return +sorted[Math.min(sorted.length - 1, Math.floor(q * sorted.length))]!.toFixed(1)
}
const summary = Object.fromEntries(
  Object.entries(samples).map(([level, values]) => [
    level,
    {
      p50_ms: quantile(values, 0.5),
      p99_ms: quantile(values, 0.99),
      max_ms: quantile(values, 1),
      own_p50_ms: quantile(own[level]!, 0.5),
      own_p99_ms: quantile(own[level]!, 0.99),
      to_provider_p50_ms: split[level] ? quantile(split[level].before, 0.5) : undefined,
      after_provider_p50_ms: split[level] ? quantile(split[level].after, 0.5) : undefined,
      processes_per_message: Object.fromEntries(
        Object.entries(spawnsPer[level] ?? {}).map(([file, count]) => [file, +count.toFixed(2)]),
      ),
      cold_first_message_p50_ms: cold[level] ? quantile(cold[level], 0.5) : undefined,
    },
  ]),
)
const p50 = (level: string) => (summary[level] as {p50_ms: number}).p50_ms
const ratios = Object.fromEntries(
  Object.keys(levels)
    .filter((level) => level !== 'unrestricted' && 'unrestricted' in levels)
    .map((level) => [`${level}_to_unrestricted_p50`, +(p50(level) / p50('unrestricted')).toFixed(2)]),
)

let profile: ReturnType<typeof hottest> | undefined
if (process.env.BENCH_PROFILE) profile = hottest(profileDir)
await removeHome(home)

report('warm-levels', {
  messages_per_level: MESSAGES,
  agents_per_level: AGENTS,
  cpus: os.cpus().length,
  load_average_at_end: os.loadavg().map((value) => +value.toFixed(2)),
  docker: dockerUp,
  levels: summary,
  ...ratios,
  // a standby that could not be used (the log says why): each is a cold start among the samples
  standbys_not_used: coldLines,
  failed_messages: failures.length,
  failed_why: failures.slice(0, 3).map((line) => line.slice(0, 400)),
  standbys_not_used_why: coldReasons,
  standbys_at_end: healthz.standbys,
  ...(profile ? {serve_profile: profile} : {}),
})

/**
 * Where the gateway process spent its busy time (from --cpu-prof, idle left out): each function's
 * own time while the measured messages ran, with the app's function that called it (the first
 * caller in the CLI bundle), heaviest first. The profile is kept as bench/results/warm-levels.cpuprofile.
 */
function hottest(dir: string): {
  busy_ms: number
  busy_ms_per_message?: number
  functions: Array<{function: string; self_ms: number; share: string}>
} {
  const file = fs.readdirSync(dir).find((name) => name.endsWith('.cpuprofile'))
  if (!file) return {busy_ms: 0, functions: []}
  fs.copyFileSync(path.join(dir, file), path.join(ROOT, 'bench', 'results', 'warm-levels.cpuprofile'))
  const prof = JSON.parse(fs.readFileSync(path.join(dir, file), 'utf8')) as {
    nodes: Array<{id: number; children?: number[]; callFrame: {functionName: string; url: string; lineNumber: number}}>
    startTime: number
    samples: number[]
    timeDeltas: number[]
  }
  const byId = new Map(prof.nodes.map((node) => [node.id, node]))
  const parent = new Map<number, number>()
  for (const node of prof.nodes) for (const child of node.children ?? []) parent.set(child, node.id)
  const named = (id: number) => {
    const frame = byId.get(id)!.callFrame
    return `${frame.functionName || '(anonymous)'} ${path.basename(frame.url)}:${frame.lineNumber}`
  }
  const appCaller = (id: number) => {
    for (let at = parent.get(id); at !== undefined; at = parent.get(at))
      if (byId.get(at)!.callFrame.url.endsWith('cli.cjs')) return named(at)
    return undefined
  }
  const self = new Map<string, number>()
  let busy = 0
  let at = prof.startTime
  prof.samples.forEach((id, i) => {
    at += prof.timeDeltas[i] ?? 0
    if (at < measuredFrom || at > measuredTo || byId.get(id)!.callFrame.functionName === '(idle)') return
    const ms = (prof.timeDeltas[i] ?? 0) / 1000
    busy += ms
    const leaf = named(id)
    const caller = leaf.includes('cli.cjs') ? undefined : appCaller(id)
    const name = caller ? `${leaf} <- ${caller}` : leaf
    self.set(name, (self.get(name) ?? 0) + ms)
  })
  return {
    busy_ms: Math.round(busy),
    busy_ms_per_message: +(busy / windows.length).toFixed(1),
    functions: [...self]
      .sort((a, b) => b[1] - a[1])
      .slice(0, 20)
      .map(([name, ms]) => ({function: name, self_ms: Math.round(ms), share: `${((100 * ms) / busy).toFixed(1)} %`})),
  }
}
