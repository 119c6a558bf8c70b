// Issue 11 target: per LLM call, the channel (agent-run asks its runner over stdin/stdout, the
// runner calls the provider) adds at most 5 ms over agent-run calling the provider itself.
//
// Same run, same fake LLM answering at once, same agent-run (bin/run.js → the bundle), unrestricted:
// - `direct`: agent-run run by hand (no llm_channel), calling the fake LLM itself;
// - `channel`: agent-run under the real runner code (runAgentProcess + the host provider chain).
// Each run makes CALLS LLM calls (a cheap tool call each time, then the answer). The per-call
// time is the gap between consecutive requests at the fake LLM, which holds everything a call
// costs besides the LLM itself (the tool is the same in both), and nothing of start-up.
import {execa} from 'execa'
import fs from 'node:fs'
import os from 'node:os'
import path from 'node:path'
import {startFakeLlm} from '../test/fakes/llm-server.js'
import {resolveAgent} from '../src/runtime/config/load.js'
import type {GatewayConfig} from '../src/runtime/config/types.js'
import {agentRunArgv, runAgentProcess} from '../src/runtime/run-lifecycle/agent-run-process.js'
import {hostLlmFor} from '../src/runtime/llm-channel/host.js'
import {fmt, report, stats} from './lib.js'

const RUNS = Number(process.env.BENCH_N ?? 15)
const CALLS = 10
const KEY = 'sk-bench-key-123456'

const llm = await startFakeLlm()
const workspace = fs.mkdtempSync(path.join(os.tmpdir(), 'meepa-bench-channel-'))
const agent = resolveAgent({id: 'bench', max_iterations: CALLS, file_access: {unrestricted: true}} as never, {})
const config = {
  providers: {
    primary: 'fake',
    fallback: [],
    providers: {fake: {kind: 'openai', api_key_env: 'FAKE_LLM_KEY', model: 'm', base_url: llm.openaiBaseUrl}},
  },
} as unknown as GatewayConfig
const input = (runId: string) => ({
  version: 1 as const,
  run_id: runId,
  agent,
  providers: config.providers,
  secrets: {},
  workspace,
  message: {id: 'm', connector: 'cli', channel_id: runId, user: {id: 'u', name: 'u'}, content: 'hi'},
})
const env = {PATH: process.env.PATH ?? '/usr/bin:/bin', HOME: workspace, LANG: 'C.UTF-8'}

/** Scripts one run's turns and returns the median gap between its consecutive LLM requests. */
async function perCall(run: () => Promise<boolean>): Promise<number> {
  llm.reset()
  for (let i = 1; i < CALLS; i++) llm.enqueue({toolCalls: [{name: 'list_files', arguments: {}}]})
  llm.enqueue({text: 'done'})
  if (!(await run())) throw new Error('bench run failed')
  const times = llm.requests.map((request) => request.time)
  if (times.length !== CALLS) throw new Error(`expected ${CALLS} LLM calls, got ${times.length}`)
  return (times.at(-1)! - times[0]!) / (CALLS - 1)
}

const direct = async () => {
  const result = await execa(agentRunArgv()[0]!, agentRunArgv().slice(1), {
    input: JSON.stringify(input(`run_direct_${Date.now()}`)),
    env: {...env, FAKE_LLM_KEY: KEY},
    extendEnv: false,
    reject: false,
  })
  return JSON.parse(result.stdout).ok === true
}
const channel = async () => {
  const output = await runAgentProcess({
    argv: agentRunArgv(),
    env,
    cwd: workspace,
    input: input(`run_channel_${Date.now()}`),
    llm: hostLlmFor(agent, config, {FAKE_LLM_KEY: KEY}),
    timeoutMs: 60_000,
  })
  return output.ok
}

// Interleaved, so a busy moment on the machine lands on both.
const samples = {direct: [] as number[], channel: [] as number[]}
for (let i = 0; i < RUNS + 2; i++) {
  const d = await perCall(direct)
  const c = await perCall(channel)
  if (i >= 2) {
    samples.direct.push(d)
    samples.channel.push(c)
  }
}
await llm.close()
fs.rmSync(workspace, {recursive: true, force: true})

const directStats = stats(samples.direct)
const channelStats = stats(samples.channel)
const added = channelStats.median - directStats.median
report('llm-channel', {
  runs: RUNS,
  calls_per_run: CALLS,
  per_call_direct: directStats,
  per_call_channel: channelStats,
  added_ms_per_call: +added.toFixed(2),
  ratio: +(channelStats.median / directStats.median).toFixed(2),
  target_added_ms: 5,
  summary: `per LLM call (incl. one list_files tool call) ${fmt(channelStats.median)} through the channel vs ${fmt(directStats.median)} direct: +${added.toFixed(2)} ms (target ≤ 5 ms)`,
})
