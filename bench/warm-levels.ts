// Issue 25, criterion 3: a web-chat message to a fake LLM that answers at once, through a real
// `serve`, at the three isolation levels side by side in one gateway (10 agents per level), every
// message after the first of each agent served by a standby. Messages go one at a time, levels
// interleaved (the machine's load weighs on each the same), agents in turn.
//
// Targets: host sandbox ≤ 1.2× unrestricted, container (standby) ≤ 1.5× unrestricted, and at
// every level the gateway's own time per message ≤ 50 ms p50 and ≤ 150 ms p99 over 200 messages
// to 10 agents. The gateway's own time is the request's arrival to the reply's last byte minus
// the provider's time; the fake LLM answers at once on loopback, so it is the whole latency here
// (an upper bound). Container agents are measured when a Docker engine answers.
//
//   npx tsx bench/warm-levels.ts        (BENCH_MESSAGES: messages per level, default 200)
//   BENCH_PROFILE=1: serve runs with --cpu-prof; the gateway's hottest functions are printed
import {execa, type ResultPromise} from 'execa'
import fs from 'node:fs'
import os from 'node:os'
import path from 'node:path'
import {startFakeLlm} from '../test/fakes/llm-server.js'
import {freePort} from '../test/helpers/free-port.js'
import {fakeLlmHome, report, ROOT} from './lib.js'

const MESSAGES = Number(process.env.BENCH_MESSAGES ?? 200)
const AGENTS = 10
const bin = path.join(ROOT, 'bin', 'run.js')
const env = {FAKE_LLM_KEY: 'sk-bench', PATH: process.env.PATH ?? '/usr/bin:/bin'}

const dockerUp = (await execa('docker', ['version', '--format', '{{.Server.Version}}'], {reject: false})).exitCode === 0
const levels = {
  unrestricted: {file_access: {unrestricted: true}},
  'host-sandbox': {},
  ...(dockerUp ? {container: {container_mode: {enabled: true, network: 'none'}}} : {}),
} as Record<string, Record<string, unknown>>
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
const serveEnv = {...env, MEEPAGATEWAY_HOME: home}
const key = JSON.parse(
  (await execa(process.execPath, [bin, 'api-key', 'create', 'bench', '--json'], {env: serveEnv})).stdout,
).key as string
const profileDir = path.join(home, 'profile')
const serve: ResultPromise = execa(
  process.execPath,
  [
    ...(process.env.BENCH_PROFILE ? ['--cpu-prof', `--cpu-prof-dir=${profileDir}`] : []),
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

/** One web-chat message; the time to the reply's last byte. */
async function send(agent: string, channel: string): Promise<number> {
  const started = performance.now()
  const response = await fetch(`http://127.0.0.1:${port}/api/chat`, {
    method: 'POST',
    headers: {authorization: `Bearer ${key}`, 'content-type': 'application/json'},
    body: JSON.stringify({agent, message: 'hi', channel}),
  })
  const body = await response.text()
  const ms = performance.now() - started
  if (response.status !== 200) throw new Error(`${agent}: ${response.status} ${body}\n${output.slice(-2000)}`)
  return ms
}

// each agent's first message is cold and starts its standby; then the standbys have time to start
const cold: Record<string, number[]> = {}
for (const level of Object.keys(levels))
  for (let i = 0; i < AGENTS; i++) (cold[level] ??= []).push(await send(agentId(level, i), 'warm-up'))
await new Promise((resolve) => setTimeout(resolve, 5000))

const samples: Record<string, number[]> = Object.fromEntries(Object.keys(levels).map((level) => [level, []]))
for (let n = 0; n < MESSAGES; n++)
  for (const level of Object.keys(levels)) samples[level]!.push(await send(agentId(level, n % AGENTS), `bench-${n}`))
const notUsed = output.match(/not using the standby agent-run prepared for this agent: .*/g) ?? []
const coldLines = notUsed.length
const coldReasons = [...new Set(notUsed.map((line) => line.replace(/\d+/g, 'N').slice(0, 200)))].slice(0, 5)
const healthz = (await (await fetch(`http://127.0.0.1:${port}/healthz`)).json()) as {standbys: unknown}

serve.kill('SIGTERM')
await serve
await llm.close()

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
      cold_first_message_p50_ms: quantile(cold[level]!, 0.5),
    },
  ]),
)
const p50 = (level: string) => (summary[level] as {p50_ms: number}).p50_ms
const ratios = Object.fromEntries(
  Object.keys(levels)
    .filter((level) => level !== 'unrestricted')
    .map((level) => [`${level}_to_unrestricted_p50`, +(p50(level) / p50('unrestricted')).toFixed(2)]),
)

let profile: Array<{function: string; self_ms: number}> | undefined
if (process.env.BENCH_PROFILE) profile = hottest(profileDir)
fs.rmSync(home, {recursive: true, force: true})

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
  standbys_not_used_why: coldReasons,
  standbys_at_end: healthz.standbys,
  ...(profile ? {serve_hottest_functions: profile} : {}),
})

/** The functions the gateway process spent most of its own CPU time in (from --cpu-prof). */
function hottest(dir: string): Array<{function: string; self_ms: number}> {
  const file = fs.readdirSync(dir).find((name) => name.endsWith('.cpuprofile'))
  if (!file) return []
  const prof = JSON.parse(fs.readFileSync(path.join(dir, file), 'utf8')) as {
    nodes: Array<{id: number; callFrame: {functionName: string; url: string; lineNumber: number}}>
    samples: number[]
    timeDeltas: number[]
  }
  const byId = new Map(prof.nodes.map((node) => [node.id, node]))
  const self = new Map<string, number>()
  prof.samples.forEach((id, i) => {
    const frame = byId.get(id)!.callFrame
    const name = `${frame.functionName || '(anonymous)'} ${path.basename(frame.url)}:${frame.lineNumber}`
    self.set(name, (self.get(name) ?? 0) + (prof.timeDeltas[i] ?? 0) / 1000)
  })
  return [...self]
    .sort((a, b) => b[1] - a[1])
    .slice(0, 15)
    .map(([name, ms]) => ({function: name, self_ms: Math.round(ms)}))
}
