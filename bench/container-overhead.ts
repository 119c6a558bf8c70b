// Issue 4 target: the per-message overhead of container mode, send to reply with a fake LLM that
// answers at once, is at most 1.3 times a bare `docker run --rm <isolation image> node -e 0`
// (median, same run). Also reports the isolation image's size.
//
// Three send-to-reply numbers, all through runMessage (queue, image check, docker run of
// agent-run, reply; removal is not waited for):
// - `gateway_standby`: a running gateway, where the previous message left a standby container
//   (started at once, agent-run loaded and waiting for its input); the target is about this path;
// - `in_process`: a cold container per message, waiting for its exit as `send` does (a gateway
//   answers at agent-run's result line instead: bench/container-cold-network.ts);
// - `cli`: `meepagateway send`, which adds its own process start-up and always starts cold.
//
// The agent uses `network: host`, as it had to before the gateway made the LLM calls (issue 11);
// `in_process_network_none` is the cold path of an agent with `network: none`, which now works:
// agent-run asks the gateway for its LLM calls over the container's stdin/stdout.
import {execa} from 'execa'
import fs from 'node:fs'
import os from 'node:os'
import path from 'node:path'
import YAML from 'yaml'
import {startFakeLlm} from '../test/fakes/llm-server.js'
import {loadConfig, findAgent} from '../src/runtime/config/load.js'
import {containerImageContext} from '../src/runtime/container/context.js'
import {runMessage} from '../src/runtime/runners/run-message.js'
import {readyIsolationImage} from '../src/runtime/runners/container/runner.js'
import {stopStandbyContainers} from '../src/runtime/runners/container/standby-pool.js'
import {fmt, report, ROOT, sample, stats} from './lib.js'

const N = Number(process.env.BENCH_N ?? 15)
const GATEWAY_PAUSE_MS = 1000
const bin = path.join(ROOT, 'bin', 'run.js')

const llm = await startFakeLlm()
llm.setDefault({text: 'ok'})
const home = fs.mkdtempSync(path.join(os.tmpdir(), 'meepa-bench-container-'))
const configPath = path.join(home, 'config.yaml')
fs.writeFileSync(
  configPath,
  YAML.stringify({
    providers: {
      primary: 'fake',
      providers: {fake: {kind: 'openai', api_key_env: 'FAKE_LLM_KEY', model: 'm', base_url: llm.openaiBaseUrl}},
    },
    agents: [
      {id: 'bench', container_mode: {enabled: true, network: 'host'}},
      {id: 'bench-none', container_mode: {enabled: true, network: 'none'}},
    ],
  }),
)
process.env.FAKE_LLM_KEY = 'sk-bench-key-123456'
const loaded = loadConfig({configPath, home})
const {tag: image} = await readyIsolationImage(
  loaded.config,
  findAgent(loaded, 'bench'),
  containerImageContext(home, {onLog: (line) => process.stderr.write(`${line}\n`)}),
)

const bare = stats(await sample(N, async () => void (await execa('docker', ['run', '--rm', image, 'node', '-e', '0']))))

const sendToReply = async (standby: boolean, agentId = 'bench') => {
  const started = performance.now()
  const result = await runMessage({
    loaded,
    agentId,
    message: {id: 'm', connector: 'cli', channel_id: 'bench', user: {id: 'u', name: 'u'}, content: 'hi'},
    standby,
    onLog: () => {},
  })
  if (!result.output.ok) throw new Error(`bench run failed: ${JSON.stringify(result.output.error)}`)
  return performance.now() - started
}
// Interleaved, so a busy moment on the shared engine lands on both networks.
const cold = {host: [] as number[], none: [] as number[]}
await sample(N, async () => {
  cold.host.push(await sendToReply(false))
  cold.none.push(await sendToReply(false, 'bench-none'))
})
const inProcess = stats(cold.host.slice(2))
const inProcessNone = stats(cold.none.slice(2))
// The gateway's path: the previous message left a standby container. Messages to one agent come
// seconds apart in a chat; a pause (not timed) lets the standby finish starting, as it would there.
await sendToReply(true)
const gateway = stats(
  await sample(N, async () => {
    await new Promise((resolve) => setTimeout(resolve, GATEWAY_PAUSE_MS))
    return sendToReply(true)
  }),
)
await stopStandbyContainers()

const cli = stats(
  await sample(N, async () => {
    const result = await execa(process.execPath, [bin, 'send', '--agent', 'bench', 'hi'], {
      env: {MEEPAGATEWAY_HOME: home, FAKE_LLM_KEY: 'sk-bench-key-123456'},
      reject: false,
    })
    if (result.exitCode !== 0) throw new Error(`bench send failed: ${result.stderr}`)
  }),
)

const size = Number((await execa('docker', ['image', 'inspect', '--format', '{{.Size}}', image])).stdout)
await llm.close()
fs.rmSync(home, {recursive: true, force: true})

const ratio = (value: number) => +(value / bare.median).toFixed(2)
report('container-overhead', {
  samples: N,
  image,
  image_size_bytes: size,
  bare_docker_run_node_e_0: bare,
  send_to_reply_gateway_standby: gateway,
  send_to_reply_in_process: inProcess,
  send_to_reply_in_process_network_none: inProcessNone,
  send_to_reply_cli: cli,
  ratio_gateway_to_bare: ratio(gateway.median),
  ratio_in_process_to_bare: ratio(inProcess.median),
  ratio_in_process_network_none_to_bare: ratio(inProcessNone.median),
  ratio_cli_to_bare: ratio(cli.median),
  target_ratio: 1.3,
  summary: `send to reply ${fmt(gateway.median)} in a gateway with a standby container (${ratio(gateway.median)}x), ${fmt(inProcess.median)} cold in process (${ratio(inProcess.median)}x; network none ${fmt(inProcessNone.median)}, ${ratio(inProcessNone.median)}x), ${fmt(cli.median)} through the CLI (${ratio(cli.median)}x) vs bare docker run node -e 0 ${fmt(bare.median)}; isolation image ${Math.round(size / 1e6)} MB`,
})
