// Issue 23, speed: what one 1 MB attachment adds to a message in a running gateway. A real `serve`
// (bin/run.js, an unrestricted agent) on a fake MeepaChat and a fake LLM that answers at once:
// messages with a 1 MiB file (downloaded from the fake server into the agent's inbox, listed in the
// prompt) and the same messages without, interleaved, user's message to the bot's reply. Target:
// the median with the file ≤ the median without + 50 ms.
//
//   npx tsx bench/attachment-inbound.ts        (BENCH_ROUNDS to change the number of pairs)
import {execa} from 'execa'
import fs from 'node:fs'
import os from 'node:os'
import path from 'node:path'
import YAML from 'yaml'
import {startFakeLlm} from '../test/fakes/llm-server.js'
import {startFakeMeepaChat} from '../test/fakes/meepachat-server.js'
import {freePort} from '../test/helpers/free-port.js'
import {fakeProviders, report, ROOT, stats} from './lib.js'

const ROUNDS = Number(process.env.BENCH_ROUNDS ?? 30)
const WARMUP = 3
const TOKEN = '1.bench'
const FILE = Buffer.alloc(1024 * 1024, 0x5a) // not an image: the model request stays the same size

const llm = await startFakeLlm()
llm.setDefault({text: 'ok'})
const chat = await startFakeMeepaChat({token: TOKEN})
chat.files.add('/uploads/one-mib.bin', {body: FILE, contentType: 'application/octet-stream'})

const home = fs.mkdtempSync(path.join(os.tmpdir(), 'meepa-bench-files-'))
const configPath = path.join(home, 'config.yaml')
fs.writeFileSync(
  configPath,
  YAML.stringify({
    providers: fakeProviders(llm.openaiBaseUrl),
    captain: {enabled: true, bind: '127.0.0.1', port: await freePort()},
    agents: [
      {
        id: 'bench',
        file_access: {unrestricted: true},
        connectors: [{type: 'meepachat', url: chat.gatewayUrl, bot_token: TOKEN}],
      },
    ],
  }),
)
const serve = execa(process.execPath, [path.join(ROOT, 'bin', 'run.js'), 'serve', '--config', configPath], {
  env: {MEEPAGATEWAY_HOME: home, FAKE_LLM_KEY: 'sk-bench', PATH: process.env.PATH ?? '/usr/bin:/bin'},
  reject: false,
})
await chat.waitForReadyCount(1, 30_000)

let sent = 0
async function message(withFile: boolean): Promise<number> {
  const started = performance.now()
  chat.userSays({
    channelId: 'general',
    content: 'hello',
    ...(withFile
      ? {attachments: [{filename: 'one-mib.bin', storedPath: 'uploads/one-mib.bin', sizeBytes: FILE.length}]}
      : {}),
  })
  await chat.waitForPosts(++sent, 30_000)
  return performance.now() - started
}

const plain: number[] = []
const withFile: number[] = []
const added: number[] = []
for (let round = 0; round < WARMUP + ROUNDS; round++) {
  // alternate which goes first, so a slow moment of the machine hits both alike
  const order = round % 2 === 0 ? [false, true] : [true, false]
  const pair: Record<string, number> = {}
  for (const file of order) pair[String(file)] = await message(file)
  if (round < WARMUP) continue
  plain.push(pair.false as number)
  withFile.push(pair.true as number)
  added.push((pair.true as number) - (pair.false as number))
}
serve.kill('SIGTERM')
await serve
await chat.close()
await llm.close()
const inbox = path.join(home, 'agents', 'bench', 'inbox')
const received = fs.readdirSync(inbox).length
fs.rmSync(home, {recursive: true, force: true})

const without = stats(plain)
const withOne = stats(withFile)
report('attachment-inbound', {
  rounds: ROUNDS,
  files_received: received,
  without_ms: without,
  with_1mib_ms: withOne,
  // each round's pair, the two messages back to back: what the file added, less exposed to load swings
  added_per_pair_ms: stats(added),
  added_median_ms: Math.round((withOne.median - without.median) * 10) / 10,
  ratio_median: Math.round((withOne.median / without.median) * 100) / 100,
  target: 'added_per_pair_ms.median <= 50',
})
