// Start-up of the CLI, each a whole process and a ratio to a baseline measured in the same run,
// the runs of every case interleaved (one of each per round) so machine load hits all alike:
// - issue 2: `meepagateway --version` < 300 ms; agent-run, process start to the first provider
//   request, < 200 ms;
// - issue 13: `--help`, `config check`, `agent list`, `runs`, `container status` (engine up,
//   nothing running) each ≤ 2× `node -e 0`; `sandbox exec -- /bin/true` ≤ 0.3× Anthropic's `srt`
//   (0.0.78, a dev dependency) on the same command; `send` to an unrestricted agent with a fake
//   LLM answering at once ≤ 3× `node -e 0`; `send` to a container agent ≤ 2× a bare
//   `docker run --rm <isolation image> node -e 0`; peak RSS of each ≤ 80 MB.
// `send_unrestricted` and `send_container` are `send` with a gateway (`serve`) of their home
// running, which runs the message in an agent-run or container it started ahead
// (src/runtime/connectors/local-send/); that home is a copy of the others' so every other case runs
// without a gateway. Each such send is followed by a pause (not timed) in which the gateway starts
// its next standby, so that start does not land on the next case. Also, with no target, as a
// ratio to `node -e 0`: `container clean --dry-run`, `container images`, and both sends with no
// gateway (`send_unrestricted_one_shot`, `send_container_one_shot`: `send` runs the message itself).
// Container cases are skipped (and said so) when no Docker engine answers.
//   npx tsx bench/startup.ts        (BENCH_N=10 rounds by default)
// Every process gets this process's environment (BENCH_ENV=inherit, the default: what an
// operator's shell gives) or only PATH and the bench's own variables (BENCH_ENV=clean).
// NODE_EXTRA_CA_CERTS alone adds ≈ 35 ms of CPU to every Node start, the baseline's included
// (bin/run.js starts the commands that open no TLS connection without it).
// The CLI runs as an operator's shell runs `meepagateway`: bin/run.js through its #! line.
import {execa} from 'execa'
import fs from 'node:fs'
import os from 'node:os'
import path from 'node:path'
import YAML from 'yaml'
import {startFakeLlm} from '../test/fakes/llm-server.js'
import {ensureWorkspace} from '../src/runtime/workspace/workspace.js'
import {loadConfig, findAgent, resolveAgent} from '../src/runtime/config/load.js'
import {containerImageContext} from '../src/runtime/container/context.js'
import {readyIsolationImage} from '../src/runtime/runners/container/runner.js'
import {fmt, removeHome, report, ROOT, type Stats, stats} from './lib.js'

const N = Number(process.env.BENCH_N ?? 10)
const bin = path.join(ROOT, 'bin', 'run.js')
const srt = path.join(ROOT, 'node_modules', '.bin', 'srt')

const llm = await startFakeLlm()
llm.setDefault({text: 'ok'})
const home = fs.mkdtempSync(path.join(os.tmpdir(), 'meepa-bench-'))
const configPath = path.join(home, 'config.yaml')
fs.writeFileSync(
  configPath,
  YAML.stringify({
    providers: {
      primary: 'fake',
      providers: {fake: {kind: 'openai', api_key_env: 'FAKE_LLM_KEY', model: 'm', base_url: llm.openaiBaseUrl}},
    },
    captain: {enabled: false},
    agents: [
      {id: 'boxed'}, // host sandbox, the default
      {id: 'free', file_access: {unrestricted: true}},
      {id: 'contained', container_mode: {enabled: true, network: 'host'}}, // the fake LLM is on the host's loopback
    ],
  }),
)
const benchEnv = process.env.BENCH_ENV === 'clean' ? 'clean' : 'inherit'
const env: Record<string, string> = {
  ...(benchEnv === 'inherit'
    ? (Object.fromEntries(Object.entries(process.env).filter(([name]) => !name.startsWith('npm_'))) as Record<
        string,
        string
      >)
    : {}),
  MEEPAGATEWAY_HOME: home,
  FAKE_LLM_KEY: 'sk-bench-key-123456',
  // the `node` bin/run.js's #! line finds is this one
  PATH: `${path.dirname(process.execPath)}:${process.env.PATH ?? ''}`,
}
const cli = (...args: string[]) => [bin, ...args]
for (const agent of ['boxed', 'free', 'contained'])
  await execa(process.execPath, [bin, 'agent', 'create', agent], {env, extendEnv: false})

const engineUp = await execa('docker', ['info', '--format', '{{.ServerVersion}}'], {
  reject: false,
  timeout: 10_000,
}).then((result) => result.exitCode === 0)
let isolationImage: string | undefined
if (engineUp) {
  process.env.FAKE_LLM_KEY = env.FAKE_LLM_KEY
  const loaded = loadConfig({configPath, home})
  isolationImage = (
    await readyIsolationImage(
      loaded.config,
      findAgent(loaded, 'contained'),
      containerImageContext(home, {onLog: (line) => process.stderr.write(`${line}\n`)}),
    )
  ).tag
} else {
  process.stderr.write('startup bench: no Docker engine answers; skipping the container cases\n')
}

// the home `send_unrestricted` runs in, with a gateway serving it
const servedHome = fs.mkdtempSync(path.join(os.tmpdir(), 'meepa-bench-served-'))
fs.copyFileSync(configPath, path.join(servedHome, 'config.yaml'))
const servedEnv = {...env, MEEPAGATEWAY_HOME: servedHome}
const gateway = execa(process.execPath, [bin, 'serve'], {
  env: servedEnv,
  extendEnv: false,
  reject: false,
  stdio: 'ignore',
})
for (const deadline = Date.now() + 20_000; !fs.existsSync(path.join(servedHome, 'run', 'send.token'));) {
  if (Date.now() > deadline || gateway.exitCode !== null)
    throw new Error('startup bench: the gateway for send_unrestricted did not start')
  await new Promise((resolve) => setTimeout(resolve, 50))
}

// srt with the same intent as the agent's policy: write only the workspace, no network
const srtSettings = path.join(home, 'srt-settings.json')
fs.writeFileSync(
  srtSettings,
  JSON.stringify({
    network: {allowedDomains: [], deniedDomains: []},
    filesystem: {
      denyRead: [path.join(os.homedir(), '.ssh')],
      allowWrite: [path.join(home, 'agents', 'boxed')],
      denyWrite: [],
    },
  }),
)

const cases: Record<string, string[]> = {
  node_e_0: [process.execPath, '-e', '0'],
  version: cli('--version'),
  help: cli('--help'),
  config_check: cli('config', 'check'),
  agent_list: cli('agent', 'list'),
  runs: cli('runs'),
  sandbox_exec: cli('sandbox', 'exec', '--agent', 'boxed', '--', '/bin/true'),
  srt: [srt, '-s', srtSettings, '/bin/true'],
  send_unrestricted: cli('send', '--agent', 'free', 'hi'),
  send_unrestricted_one_shot: cli('send', '--agent', 'free', 'hi'),
  ...(isolationImage
    ? {
        container_status: cli('container', 'status'),
        // no target in issue 13; what cron runs (a dry run: the bench must not remove the engine's images)
        container_clean: cli('container', 'clean', '--dry-run'),
        container_images: cli('container', 'images'),
        send_container: cli('send', '--agent', 'contained', 'hi'),
        send_container_one_shot: cli('send', '--agent', 'contained', 'hi'),
        docker_run_bare: ['docker', 'run', '--rm', isolationImage, 'node', '-e', '0'],
      }
    : {}),
}

/** The cases `send` runs with a gateway serving their home. */
const SERVED = new Set(['send_unrestricted', 'send_container'])
/** The environment of a case: the served home's for the SERVED ones. */
const envOf = (name: string) => (SERVED.has(name) ? servedEnv : env)

async function once(name: string, argv: string[]): Promise<number> {
  const [file, ...args] = argv as [string, ...string[]]
  const started = performance.now()
  const result = await execa(file, args, {env: envOf(name), extendEnv: false, reject: false, cwd: home})
  const ms = performance.now() - started
  if (result.exitCode !== 0)
    throw new Error(`${argv.join(' ')} exited ${result.exitCode}: ${String(result.stderr).slice(-500)}`)
  // the gateway starts the agent's next agent-run or container: not on the next case's time
  if (SERVED.has(name)) await new Promise((resolve) => setTimeout(resolve, name === 'send_container' ? 1500 : 300))
  return ms
}

/** Peak resident set of the process and the children it waited for (GNU time), in MB. */
async function peakRssMb(name: string, argv: string[]): Promise<number> {
  const result = await execa('/usr/bin/time', ['-f', '%M', ...argv], {
    env: envOf(name),
    extendEnv: false,
    reject: false,
    cwd: home,
  })
  return Number(String(result.stderr).trim().split('\n').at(-1)) / 1024
}

// agent-run alone: process start to its first provider request (issue 2)
const workspace = ensureWorkspace(home, 'agent-run-bench').path
let runIndex = 0
const agentRunInput = () =>
  JSON.stringify({
    version: 1,
    run_id: `bench-${runIndex++}`,
    agent: resolveAgent({id: 'agent-run-bench'}, {}),
    providers: {
      primary: 'fake',
      fallback: [],
      providers: {fake: {kind: 'openai', model: 'm', base_url: llm.openaiBaseUrl}},
    },
    secrets: {},
    message: {id: 'm', connector: 'cli', channel_id: 'bench', user: {id: 'u', name: 'u'}, content: 'hi'},
    workspace,
  })
const agentRunToFirstRequest = async () => {
  const before = llm.requests.length
  const started = Date.now()
  await execa(process.execPath, [bin, 'agent-run'], {
    input: agentRunInput(),
    env: {HOME: workspace, PATH: process.env.PATH},
    extendEnv: false,
  })
  return (llm.requests[before]?.time ?? Number.NaN) - started
}

const samples: Record<string, number[]> = Object.fromEntries(
  [...Object.keys(cases), 'agent_run_to_first_request'].map((name) => [name, []]),
)
for (let round = 0; round < N + 2; round++) {
  for (const [name, argv] of Object.entries(cases)) {
    const ms = await once(name, argv)
    if (round >= 2) samples[name]?.push(ms) // two warm-up rounds
  }
  const ms = await agentRunToFirstRequest()
  if (round >= 2) samples.agent_run_to_first_request?.push(ms)
}
const results: Record<string, Stats> = Object.fromEntries(
  Object.entries(samples).map(([name, list]) => [name, stats(list)]),
)
const rss: Record<string, number> = {}
for (const [name, argv] of Object.entries(cases))
  if (!['node_e_0', 'srt', 'docker_run_bare'].includes(name)) rss[name] = +(await peakRssMb(name, argv)).toFixed(1)
// what the gateway holds for send_unrestricted: itself and the agent-run waiting for the next message
const vmHwmMb = (pid: number) =>
  Number(/VmHWM:\s+(\d+)/.exec(fs.readFileSync(`/proc/${pid}/status`, 'utf8'))?.[1]) / 1024
// agent-run itself (`node bin/run.js agent-run`), not its keeper
const standbys = fs.readdirSync('/proc').filter((pid) => {
  try {
    return (
      /^\d+$/.test(pid) &&
      fs.readFileSync(`/proc/${pid}/cmdline`, 'utf8') === `${process.execPath}\0${bin}\0agent-run\0` &&
      fs.readlinkSync(`/proc/${pid}/cwd`).startsWith(servedHome)
    )
  } catch {
    return false // gone since the listing (another developer's process, on a shared machine)
  }
})
const gatewayRss = {
  gateway_mb: +vmHwmMb(gateway.pid!).toFixed(1),
  standby_agent_runs_mb: standbys.map((pid) => +vmHwmMb(Number(pid)).toFixed(1)),
}
gateway.kill('SIGTERM')
await gateway
await llm.close()
for (const dir of [home, servedHome]) await removeHome(dir)

const median = (name: string) => results[name]?.median ?? Number.NaN
const node = median('node_e_0')
const targets: Array<{case: string; baseline: string; max_ratio: number}> = [
  ...['help', 'config_check', 'agent_list', 'runs', 'container_status'].map((name) => ({
    case: name,
    baseline: 'node_e_0',
    max_ratio: 2,
  })),
  {case: 'sandbox_exec', baseline: 'srt', max_ratio: 0.3},
  {case: 'send_unrestricted', baseline: 'node_e_0', max_ratio: 3},
  {case: 'send_container', baseline: 'docker_run_bare', max_ratio: 2},
]
const ratios = targets
  .filter((target) => results[target.case] && results[target.baseline])
  .map((target) => {
    const ratio = +(median(target.case) / median(target.baseline)).toFixed(2)
    return {
      ...target,
      median_ms: +median(target.case).toFixed(1),
      baseline_ms: +median(target.baseline).toFixed(1),
      ratio,
      met: ratio <= target.max_ratio,
      peak_rss_mb: rss[target.case],
      rss_met: (rss[target.case] ?? 0) <= 80,
    }
  })

/** Commands without a target of their own, as a ratio to `node -e 0`. */
const untargeted = (
  [
    ['send_unrestricted_one_shot', 'node_e_0'],
    ['send_container_one_shot', 'docker_run_bare'],
    ['container_clean', 'node_e_0'],
    ['container_images', 'node_e_0'],
  ] as const
)
  .filter(([name]) => results[name])
  .map(([name, baseline]) => ({
    case: name,
    baseline,
    median_ms: +median(name).toFixed(1),
    ratio: +(median(name) / median(baseline)).toFixed(2),
    peak_rss_mb: rss[name],
  }))

report(benchEnv === 'clean' ? 'startup-clean-env' : 'startup', {
  samples: N,
  environment: benchEnv,
  node_extra_ca_certs: Boolean(env.NODE_EXTRA_CA_CERTS),
  load_average: os.loadavg().map((load) => +load.toFixed(2)),
  medians_ms: Object.fromEntries(Object.entries(results).map(([name, s]) => [name, +s.median.toFixed(1)])),
  stats: results,
  peak_rss_mb: rss,
  ratios,
  issue2: {
    ratio_version_to_node: +(median('version') / node).toFixed(2),
    ratio_agent_run_to_node: +(median('agent_run_to_first_request') / node).toFixed(2),
    targets: {version_ms: 300, agent_run_ms: 200},
  },
  untargeted,
  /** Peak RSS of the gateway `send_unrestricted` talks to, and of its standby agent-run(s). */
  gateway_peak_rss: gatewayRss,
  summary: [
    ...ratios.map(
      (r) =>
        `${r.case} ${fmt(r.median_ms)} = ${r.ratio}x ${r.baseline} (${fmt(r.baseline_ms)}), target ≤ ${r.max_ratio}x: ${r.met ? 'met' : 'NOT met'}; peak RSS ${r.peak_rss_mb} MB`,
    ),
    ...untargeted.map(
      (r) => `${r.case} ${fmt(r.median_ms)} = ${r.ratio}x ${r.baseline} (no target); peak RSS ${r.peak_rss_mb} MB`,
    ),
  ].join('\n'),
})
