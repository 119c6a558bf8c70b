// The work `config check`, `agent list` and `runs` do after the CLI has started (issue 13): each
// library call timed in a fresh process (its first call, what a CLI pays: wall and the process's
// CPU, which moves less with machine load), then warm (median of 50 calls), over BENCH_N processes.
// Run `npm run build` first: it times dist/ (no code cache, unlike the CLI).
//   npx tsx bench/light-commands.ts        (BENCH_N=15 processes by default)
// The home is the startup bench's: agents boxed (host sandbox), free (unrestricted), contained
// (container), their workspaces, and 200 run records.
import {execFileSync} from 'node:child_process'
import fs from 'node:fs'
import os from 'node:os'
import path from 'node:path'
import {pathToFileURL} from 'node:url'
import YAML from 'yaml'
import {ensureWorkspace} from '../src/runtime/workspace/workspace.js'
import {withGatewayDb} from '../src/runtime/state/gateway-db.js'
import {RunRecords} from '../src/runtime/state/run-records.js'
import {report, ROOT, stats} from './lib.js'

const N = Number(process.env.BENCH_N ?? 15)
const home = fs.mkdtempSync(path.join(os.tmpdir(), 'meepa-bench-light-'))
fs.writeFileSync(
  path.join(home, 'config.yaml'),
  YAML.stringify({
    providers: {
      primary: 'fake',
      providers: {fake: {kind: 'openai', api_key_env: 'FAKE_LLM_KEY', model: 'm', base_url: 'http://127.0.0.1:1/v1'}},
    },
    captain: {enabled: false},
    agents: [
      {id: 'boxed'},
      {id: 'free', file_access: {unrestricted: true}},
      {id: 'contained', container_mode: {enabled: true, network: 'host'}},
    ],
  }),
)
for (const agent of ['boxed', 'free', 'contained']) ensureWorkspace(home, agent)
withGatewayDb(home, (db) => {
  const records = new RunRecords(db)
  for (let i = 0; i < 200; i++)
    records.start({
      id: `run-${i}`,
      agentId: 'boxed',
      connector: 'cli',
      channelId: 'c',
      isolation: 'host-sandbox',
      startedAt: Date.now() - i * 1000,
    })
})

const dist = (file: string) => JSON.stringify(pathToFileURL(path.join(ROOT, 'dist', file)).href)
// one process: every call's first time, then its warm median
const script = `
const {loadConfig} = await import(${dist('runtime/config/load.js')})
const {describeConfig} = await import(${dist('runtime/config/report.js')})
const {sandboxConfigWarnings} = await import(${dist('runtime/host-sandbox/config-warnings.js')})
const {listAgents} = await import(${dist('runtime/workspace/agents.js')})
const {listRuns} = await import(${dist('runtime/state/run-records.js')})
const home = process.argv[1]
const out = {}
// first calls in the order the commands make them, before any warm loop (whose compiler threads would bill them)
const first = async (name, fn) => {
  const cpu = process.cpuUsage()
  const started = performance.now()
  const value = await fn()
  out[name + ' first'] = performance.now() - started
  const used = process.cpuUsage(cpu)
  out[name + ' first cpu'] = (used.user + used.system) / 1000
  return value
}
const warm = async (name, fn) => {
  const times = []
  for (let i = 0; i < 50; i++) { const started = performance.now(); await fn(); times.push(performance.now() - started) }
  out[name + ' warm'] = times.sort((a, b) => a - b)[25]
}
const loaded = await first('loadConfig', () => loadConfig({home}))
await first('describeConfig', () => describeConfig(loaded))
await first('sandboxConfigWarnings', () => sandboxConfigWarnings(loaded))
await first('listAgents', () => listAgents(loaded))
await first('listRuns', () => listRuns({home, limit: 20}))
await warm('loadConfig', () => loadConfig({home}))
await warm('describeConfig', () => describeConfig(loaded))
await warm('sandboxConfigWarnings', () => sandboxConfigWarnings(loaded))
await warm('listAgents', () => listAgents(loaded))
await warm('listRuns', () => listRuns({home, limit: 20}))
console.log(JSON.stringify(out))`

const samples: Record<string, number[]> = {}
for (let round = 0; round < N; round++) {
  const out = JSON.parse(
    execFileSync(process.execPath, ['--input-type=module', '-e', script, home], {
      encoding: 'utf8',
      env: {PATH: process.env.PATH ?? '', MEEPAGATEWAY_HOME: home},
    }),
  ) as Record<string, number>
  for (const [name, ms] of Object.entries(out)) (samples[name] ??= []).push(ms)
}
fs.rmSync(home, {recursive: true, force: true})
report('light-commands', {
  processes: N,
  ms: Object.fromEntries(Object.entries(samples).map(([name, values]) => [name, stats(values)])),
})
