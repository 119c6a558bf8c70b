// Issue 5, criterion 6: 20 agents × 5 messages through the web chat API of a real `serve`
// process, against a fake LLM that answers at once, in the unrestricted and host-sandbox levels.
// Reports messages per second and p50/p95 latency, each as a ratio to running the same messages
// without the gateway (runMessage: agent-run started by the level's runner, same concurrency, same
// machine, same run), and the gateway's resident memory with 20 idle agents.
//
//   npx tsx bench/gateway-webchat.ts            (BENCH_AGENTS, BENCH_MESSAGES to change the load)
import {execa, type ResultPromise} from 'execa'
import fs from 'node:fs'
import os from 'node:os'
import path from 'node:path'
import YAML from 'yaml'
import {startFakeLlm} from '../test/fakes/llm-server.js'
import {runMessage} from '../src/runtime/runners/run-message.js'
import {loadConfig} from '../src/runtime/config/load.js'
import {report, ROOT, stats} from './lib.js'
import {freePort} from '../test/helpers/free-port.js'

const AGENTS = Number(process.env.BENCH_AGENTS ?? 20)
const MESSAGES = Number(process.env.BENCH_MESSAGES ?? 5)
const CONCURRENCY = 4 // the default gateway.max_concurrent_runs: the direct baseline runs as many at once
const bin = path.join(ROOT, 'bin', 'run.js')

const llm = await startFakeLlm()
llm.setDefault({text: 'ok'})

function makeHome(port: number): {home: string; configPath: string} {
  const home = fs.mkdtempSync(path.join(os.tmpdir(), 'meepa-bench-gw-'))
  const configPath = path.join(home, 'config.yaml')
  const agents = Array.from({length: AGENTS}, (_, i) => ({id: `agent-${String(i + 1).padStart(2, '0')}`}))
  fs.writeFileSync(
    configPath,
    YAML.stringify({
      providers: {
        primary: 'fake',
        providers: {fake: {kind: 'openai', api_key_env: 'FAKE_LLM_KEY', model: 'fake', base_url: llm.openaiBaseUrl}},
      },
      captain: {enabled: true, bind: '127.0.0.1', port},
      gateway: {max_concurrent_runs: CONCURRENCY, queue_limit: 50},
      agents,
    }),
  )
  return {home, configPath}
}

function rssMb(pid: number): number {
  const status = fs.readFileSync(`/proc/${pid}/status`, 'utf8')
  return Math.round(Number(/VmRSS:\s+(\d+) kB/.exec(status)?.[1]) / 102.4) / 10
}

const env = {FAKE_LLM_KEY: 'sk-bench', PATH: process.env.PATH ?? '/usr/bin:/bin'}

/** Runs `tasks` with at most `limit` at once; returns each task's latency and the wall time. */
async function pooled(
  count: number,
  limit: number,
  task: (index: number) => Promise<void>,
): Promise<{latencies: number[]; wallMs: number}> {
  const latencies: number[] = []
  let next = 0
  const started = performance.now()
  await Promise.all(
    Array.from({length: limit}, async () => {
      while (next < count) {
        const index = next++
        const t0 = performance.now()
        await task(index)
        latencies.push(performance.now() - t0)
      }
    }),
  )
  return {latencies, wallMs: performance.now() - started}
}

/**
 * Baseline: the same runs without the gateway: runMessage (agent-run started by the level's own
 * runner, exactly as the gateway starts it) called directly, CONCURRENCY at a time.
 */
async function direct(level: 'unrestricted' | 'host-sandbox'): Promise<{latencies: number[]; wallMs: number}> {
  const {home, configPath} = makeHome(0)
  const loaded = loadConfig({configPath, home, env: {...process.env, ...env}})
  const total = AGENTS * MESSAGES
  const result = await pooled(total, CONCURRENCY, async (index) => {
    const agentId = loaded.config.agents[index % AGENTS]!.id
    const message = {
      id: `m${index}`,
      connector: 'bench',
      channel_id: `bench-${index}`,
      user: {id: 'u', name: 'u'},
      content: 'hi',
    }
    const {output} = await runMessage({loaded, agentId, message, unrestricted: level === 'unrestricted'})
    if (!output.ok) throw new Error(`direct ${level} run failed: ${output.error.code} ${output.error.message}`)
  })
  fs.rmSync(home, {recursive: true, force: true})
  return result
}

async function throughGateway(level: 'unrestricted' | 'host-sandbox') {
  const port = await freePort()
  const {home, configPath} = makeHome(port)
  const key = JSON.parse(
    (
      await execa(process.execPath, [bin, 'api-key', 'create', 'bench', '--json'], {
        env: {...env, MEEPAGATEWAY_HOME: home},
      })
    ).stdout,
  ).key as string
  let output = ''
  const serve: ResultPromise = execa(
    process.execPath,
    [bin, 'serve', '--config', configPath, ...(level === 'unrestricted' ? ['--unrestricted'] : [])],
    {
      env: {...env, MEEPAGATEWAY_HOME: home},
      reject: false,
    },
  )
  serve.stdout?.on('data', (chunk) => (output += String(chunk)))
  serve.stderr?.on('data', (chunk) => (output += String(chunk)))
  while (!output.includes('listening on')) {
    if (serve.exitCode !== null) throw new Error(`serve exited:\n${output}`)
    await new Promise((resolve) => setTimeout(resolve, 50))
  }
  await new Promise((resolve) => setTimeout(resolve, 2000)) // settle: start-up garbage collected, idle
  const idleRssMb = rssMb(serve.pid!)

  const total = AGENTS * MESSAGES
  const failures: string[] = []
  const send = async (index: number) => {
    const response = await fetch(`http://127.0.0.1:${port}/api/chat`, {
      method: 'POST',
      headers: {authorization: `Bearer ${key}`, 'content-type': 'application/json'},
      body: JSON.stringify({
        agent: `agent-${String((index % AGENTS) + 1).padStart(2, '0')}`,
        message: 'hi',
        channel: `bench-${index}`,
      }),
    })
    const body = (await response.json()) as {reply?: string; error?: unknown}
    if (response.status !== 200) failures.push(`${response.status} ${JSON.stringify(body)}`)
  }
  // same shape as the direct baseline: CONCURRENCY clients, each sending its next message when answered
  const pooledRun = await pooled(total, CONCURRENCY, send)
  // every message at once, as a burst of chat users would: the gateway queues and limits
  const burst = await pooled(total, total, send)
  const loadedRssMb = rssMb(serve.pid!)
  serve.kill('SIGTERM')
  const exit = await serve
  fs.rmSync(home, {recursive: true, force: true})
  if (failures.length > 0)
    throw new Error(`${failures.length} request(s) failed in ${level}: ${failures.slice(0, 3).join('; ')}`)
  return {pooled: pooledRun, burst, idleRssMb, loadedRssMb, exitCode: exit.exitCode}
}

const summarise = (run: {latencies: number[]; wallMs: number}) => {
  const latency = stats(run.latencies)
  return {
    messages_per_s: +((run.latencies.length / run.wallMs) * 1000).toFixed(2),
    p50_ms: Math.round(latency.median),
    p95_ms: Math.round(latency.p95),
    wall_ms: Math.round(run.wallMs),
  }
}

const levels: Record<string, unknown> = {}
for (const level of ['unrestricted', 'host-sandbox'] as const) {
  // the machine is shared: measure the baseline right before each level it is compared with
  const directRun = summarise(await direct(level))
  const run = await throughGateway(level)
  const pooledSummary = summarise(run.pooled)
  levels[level] = {
    direct_run_message: directRun,
    gateway_4_clients: pooledSummary,
    // 1.0 = the gateway costs nothing over spawning agent-run yourself; latency ratios > 1 are its overhead
    throughput_ratio_to_direct: +(pooledSummary.messages_per_s / directRun.messages_per_s).toFixed(2),
    p50_ratio_to_direct: +(pooledSummary.p50_ms / directRun.p50_ms).toFixed(2),
    p95_ratio_to_direct: +(pooledSummary.p95_ms / directRun.p95_ms).toFixed(2),
    // all 100 at once: latency includes waiting in the agent's queue for a slot
    gateway_burst_100: summarise(run.burst),
    idle_rss_mb_20_agents: run.idleRssMb,
    rss_mb_after_load: run.loadedRssMb,
    serve_exit_code: run.exitCode,
  }
}
await llm.close()

report('gateway-webchat', {
  agents: AGENTS,
  messages_per_agent: MESSAGES,
  concurrency: CONCURRENCY,
  cpus: os.cpus().length,
  // the machine may be shared: a high load average makes every number here noisier
  load_average_at_end: os.loadavg().map((value) => +value.toFixed(2)),
  ...levels,
})
