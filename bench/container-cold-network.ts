// Issue 11 target: a cold container message with `network: none` is no slower than one with
// `network: host` was before the gateway made the LLM calls (agent-run needed the network then).
//
// Usage: npx tsx bench/container-cold-network.ts BEFORE_ROOT
// BEFORE_ROOT is a built checkout of the commit before (git worktree add /tmp/before <rev>; copy
// node_modules in, not a symlink; set its package.json version to another value, e.g. 0.0.9, so
// its isolation image gets its own tag; npm run build). Both trees' runMessage run in this one
// process, interleaved, cold (standby off), against one fake LLM answering at once.
import fs from 'node:fs'
import os from 'node:os'
import path from 'node:path'
import {startFakeLlm} from '../test/fakes/llm-server.js'
import {fmt, report, ROOT, stats} from './lib.js'

const before = process.argv[2]
if (!before || !fs.existsSync(path.join(before, 'dist', 'runtime', 'run-message.js'))) {
  process.stderr.write(
    'usage: npx tsx bench/container-cold-network.ts BEFORE_ROOT (a built checkout of the previous commit)\n',
  )
  process.exit(2)
}
const N = Number(process.env.BENCH_N ?? 20)
const llm = await startFakeLlm()
llm.setDefault({text: 'ok'})
process.env.FAKE_LLM_KEY = 'sk-bench-key-123456'
const homes: string[] = []

async function coldRun(root: string, network: 'host' | 'none'): Promise<() => Promise<number>> {
  const {loadConfig, findAgent} = await import(path.join(root, 'dist/runtime/config/load.js'))
  const {runMessage} = await import(path.join(root, 'dist/runtime/runners/run-message.js'))
  const {readyIsolationImage} = await import(path.join(root, 'dist/runtime/runners/container/runner.js'))
  const {containerImageContext} = await import(path.join(root, 'dist/runtime/container/context.js'))
  const home = fs.mkdtempSync(path.join(os.tmpdir(), 'meepa-bench-cold-'))
  homes.push(home)
  fs.writeFileSync(
    path.join(home, 'config.yaml'),
    `providers:\n  primary: fake\n  providers:\n    fake: {kind: openai, api_key_env: FAKE_LLM_KEY, model: m, base_url: "${llm.openaiBaseUrl}"}\nagents:\n  - id: b\n    container_mode: {enabled: true, network: ${network}, standby: false}\n`,
  )
  const loaded = loadConfig({configPath: path.join(home, 'config.yaml'), home})
  await readyIsolationImage(
    loaded.config,
    findAgent(loaded, 'b'),
    containerImageContext(home, {onLog: (line: string) => process.stderr.write(`${line}\n`)}),
  )
  return async () => {
    const started = performance.now()
    const result = await runMessage({
      loaded,
      agentId: 'b',
      message: {id: 'm', connector: 'cli', channel_id: 'c', user: {id: 'u', name: 'u'}, content: 'hi'},
      standby: true,
      onLog: () => {},
    })
    if (!result.output.ok) throw new Error(`${root} (${network}): ${JSON.stringify(result.output.error)}`)
    return performance.now() - started
  }
}

const cases = {
  before_network_host: await coldRun(before, 'host'),
  after_network_host: await coldRun(ROOT, 'host'),
  after_network_none: await coldRun(ROOT, 'none'),
}
const samples: Record<keyof typeof cases, number[]> = {
  before_network_host: [],
  after_network_host: [],
  after_network_none: [],
}
for (let i = 0; i < N + 1; i++) {
  for (const [name, run] of Object.entries(cases) as Array<[keyof typeof cases, () => Promise<number>]>) {
    const ms = await run()
    if (i > 0) samples[name].push(ms) // the first round warms both trees up
    await new Promise((resolve) => setTimeout(resolve, 300)) // let the last container go away
  }
}
await llm.close()
for (const home of homes) fs.rmSync(home, {recursive: true, force: true})

const result = Object.fromEntries(Object.entries(samples).map(([name, xs]) => [name, stats(xs)])) as Record<
  keyof typeof cases,
  ReturnType<typeof stats>
>
const ratio = +(result.after_network_none.median / result.before_network_host.median).toFixed(2)
report('container-cold-network', {
  samples: N,
  before_root: before,
  ...result,
  ratio_none_after_to_host_before: ratio,
  target_ratio: 1,
  summary: `cold send to reply: network none ${fmt(result.after_network_none.median)} now vs network host ${fmt(result.before_network_host.median)} before (${ratio}x; network host now ${fmt(result.after_network_host.median)})`,
})
process.exit(0)
