// Issue 2 target: `meepagateway --version` < 300 ms and agent-run start-up (process start to the
// first provider request) < 200 ms median, each reported as a ratio to `node -e 0` in the same run.
import {execa} from 'execa'
import fs from 'node:fs'
import os from 'node:os'
import path from 'node:path'
import {startFakeLlm} from '../test/fakes/llm-server.js'
import {ensureWorkspace} from '../src/runtime/workspace.js'
import {resolveAgent} from '../src/runtime/config/load.js'
import {fmt, report, ROOT, sample, stats} from './lib.js'

const N = Number(process.env.BENCH_N ?? 20)
const bin = path.join(ROOT, 'bin', 'run.js')

const nodeBare = stats(await sample(N, async () => void (await execa(process.execPath, ['-e', '0']))))
const version = stats(await sample(N, async () => void (await execa(process.execPath, [bin, '--version']))))

const llm = await startFakeLlm()
llm.setDefault({text: 'ok'})
const home = fs.mkdtempSync(path.join(os.tmpdir(), 'meepa-bench-'))
const workspace = ensureWorkspace(home, 'bench').path
const input = (runId: string) =>
  JSON.stringify({
    version: 1,
    run_id: runId,
    agent: resolveAgent({id: 'bench'}, {}),
    providers: {primary: 'fake', fallback: [], providers: {fake: {kind: 'openai', model: 'm', base_url: llm.openaiBaseUrl}}},
    secrets: {},
    message: {id: 'm', connector: 'cli', channel_id: 'bench', user: {id: 'u', name: 'u'}, content: 'hi'},
    workspace,
  })
let i = 0
const agentRun = stats(
  await sample(N, async () => {
    const before = llm.requests.length
    const started = Date.now()
    await execa(process.execPath, [bin, 'agent-run'], {input: input(`bench-${i++}`), env: {HOME: workspace, PATH: process.env.PATH}, extendEnv: false})
    return (llm.requests[before]?.time ?? Number.NaN) - started
  }),
)
await llm.close()
fs.rmSync(home, {recursive: true, force: true})

report('startup', {
  samples: N,
  node_e_0: nodeBare,
  version,
  agent_run_to_first_request: agentRun,
  ratio_version_to_node: +(version.median / nodeBare.median).toFixed(2),
  ratio_agent_run_to_node: +(agentRun.median / nodeBare.median).toFixed(2),
  targets: {version_ms: 300, agent_run_ms: 200},
  summary: `--version ${fmt(version.median)} (${(version.median / nodeBare.median).toFixed(2)}x node -e 0 = ${fmt(nodeBare.median)}); agent-run to first request ${fmt(agentRun.median)} (${(agentRun.median / nodeBare.median).toFixed(2)}x)`,
})
