#!/usr/bin/env node
// Differential fuzzer for the lite bundles (src/cli/lite/): runs many argv/env/stdin cases through
// bin/run.js and through oclif over dist/cli.cjs (as test/cli/lite.test.ts does) and reports every
// case whose exit code, stdout or stderr differ. Not a vitest file (it takes minutes): run it after
// `npm run build` with
//   node test/cli/lite-fuzz.mjs [--random N] [--seed S] [--only-random] [--jobs J] [--out diffs.json]
// Each case gets a fresh copy of a prepared home (config, workspaces, run records), so runs that
// write (a first-run config, send's records) do not leak into the next. The home path, send's run
// ids and the entry script's stack frame are normalised before comparing.
import {spawn} from 'node:child_process'
import fs from 'node:fs'
import os from 'node:os'
import path from 'node:path'
import {fileURLToPath} from 'node:url'

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..', '..')
const BIN = path.join(ROOT, 'bin', 'run.js')
const option = (name, fallback) => {
  const index = process.argv.indexOf(`--${name}`)
  return index === -1 ? fallback : process.argv[index + 1]
}
const RANDOM = Number(option('random', 300))
let seed = Number(option('seed', 1))
const JOBS = Number(option('jobs', Math.max(2, os.availableParallelism())))
const OUT = option('out', undefined)

const work = fs.mkdtempSync(path.join(os.tmpdir(), 'lite-fuzz-'))
const VIA_OCLIF = path.join(work, 'via-oclif.cjs')
fs.writeFileSync(
  VIA_OCLIF,
  `const {loadCliBundle} = require(${JSON.stringify(path.join(ROOT, 'bin', 'cli-bundle.cjs'))}); const core = loadCliBundle(${JSON.stringify(ROOT)}).exports.core(); core.settings.enableAutoTranspile = false; core.execute({loadOptions: {root: ${JSON.stringify(ROOT)}, userPlugins: false, devPlugins: false}})`,
)
const PROBE = path.join(work, 'probe.cjs')
fs.writeFileSync(
  PROBE,
  "process.on('exit', () => require('node:fs').writeSync(2, '\\nFULL_CLI ' + Object.keys(require('node:module')._cache).some((file) => file.endsWith('/dist/cli.cjs')) + '\\n'))\n",
)

// the prepared home
const template = path.join(work, 'template')
fs.mkdirSync(path.join(template, 'agents', 'boxed'), {recursive: true})
const {default: YAML} = await import('yaml')
fs.writeFileSync(
  path.join(template, 'config.yaml'),
  YAML.stringify({
    providers: {
      primary: 'p',
      providers: {p: {kind: 'openai', api_key_env: 'LITE_FUZZ_KEY', model: 'm', base_url: 'http://127.0.0.1:9/v1'}},
    },
    agents: [
      {id: 'boxed'},
      {id: 'free', file_access: {unrestricted: true}},
      {id: 'contained', container_mode: {enabled: true, network: 'none'}},
    ],
  }),
)
fs.writeFileSync(path.join(template, 'bad.yaml'), 'agents:\n  - id: "bad id"\n    max_iterations: -1\n')
fs.writeFileSync(path.join(template, 'broken.yaml'), 'agents:\n  - id: 7\nproviders: [\n')
const {RunRecords} = await import(path.join(ROOT, 'dist', 'runtime', 'state', 'run-records.js'))
const {withGatewayDb} = await import(path.join(ROOT, 'dist', 'runtime', 'state', 'gateway-db.js'))
withGatewayDb(template, (db) => {
  const records = new RunRecords(db)
  for (let k = 0; k < 30; k++) {
    records.start({
      id: `run-${k}`,
      agentId: k % 2 ? 'boxed' : 'free',
      connector: 'cli',
      channelId: 'cli',
      isolation: 'host-sandbox',
      startedAt: Date.UTC(2026, 0, 2, 3, 4, k),
    })
    if (k % 3)
      records.finish(
        `run-${k}`,
        {
          version: 1,
          ok: true,
          run_id: `run-${k}`,
          reply: {content: `hi ✓ ${k}`},
          usage: {input_tokens: 12, output_tokens: 34},
          iterations: 1,
          tool_calls: [],
        },
        {durationMs: 1234},
      )
  }
  records.reject(
    {
      id: 'run-x',
      agentId: 'free',
      connector: 'api',
      channelId: 'api-1/x',
      isolation: 'unrestricted',
      startedAt: Date.UTC(2026, 0, 2, 3, 5, 6),
    },
    'E_QUEUE_FULL',
    'the queue is full\nsecond line',
  )
})

// the cases
const rnd = () => ((seed = (seed * 1103515245 + 12345) & 0x7fffffff), seed / 0x7fffffff)
const pick = (list) => list[Math.floor(rnd() * list.length)]
const envs = [
  {},
  {MEEPAGATEWAY_CONTENT_TYPE: 'json'},
  {MEEPAGATEWAY_CONTENT_TYPE: 'Json'},
  {FORCE_COLOR: '1'},
  {FORCE_COLOR: '0'},
  {NO_COLOR: '1'},
  {OCLIF_COLUMNS: '30'},
  {DEBUG: ''},
  {MEEPAGATEWAY_DEBUG: ''},
  {LITE_FUZZ_KEY: 'sk-test'},
  {HOME: '/nonexistent'},
  {MEEPAGATEWAY_HOME: ''},
  {MEEPAGATEWAY_HOME: 'relative-home'},
  {DOCKER_HOST: 'unix:///nonexistent.sock'},
  {__IS_WSL_TEST__: '1'},
]
const plain = [
  ['agent', 'list'],
  ['agent', 'list', '--json'],
  ['agent', 'list', '--config', '<HOME>/config.yaml'],
  ['agent', 'list', '--config=<HOME>/bad.yaml'],
  ['agent', 'list', '--config=<HOME>/broken.yaml', '--json'],
  ['agent', 'list', '--config=<HOME>/new.yaml'],
  ['agent', 'list', '--config=relative.yaml'],
  ['runs'],
  ['runs', '--json'],
  ['runs', '-n', '3'],
  ['runs', '-n', '007'],
  ['runs', '--limit=10000'],
  ['runs', '-a', 'free', '-n', '2'],
  ['runs', '--agent=nobody', '--json'],
  ['runs', '--agent', 'ünï'],
  ['runs', '--agent=-x'],
  ['runs', '--agent=--json'],
  ['runs', '--agent', '%s'],
  ['runs', '--limit', '9007199254740993'],
  ['runs', '--limit=-0'],
  ['runs', '-n', '٣'],
  ['config', 'check'],
  ['config', 'check', '--json'],
  ['config', 'check', '--config', '<HOME>/bad.yaml'],
  ['config', 'check', '--config', '<HOME>/broken.yaml', '--json'],
  ['config', 'check', '--config=/nonexistent.yaml'],
  ['config', 'check', '--config', '/dev/null'],
  ['container', 'status'],
  ['container', 'status', '--json'],
  ['send', '--agent', 'boxed', 'hi'],
  ['send', '-a', 'free', 'hi', '--json'],
  ['send', '--agent', 'nobody', 'hi'],
  ['send', '--agent', 'free', '-'],
  ['send', '--agent=free', '--unrestricted', 'x'],
  ['send', 'hi', '--agent', 'free'],
  ['send', '--agent', 'free', ''],
  ['send', '--agent', 'free', '--', 'x'],
  ['send', '--agent', 'free'],
  ['sandbox', 'exec', '--agent', 'free', '--', 'sh', '-c', 'echo out; echo err >&2; exit 3'],
  ['sandbox', 'exec', '-afree', '--', 'echo', '--help'],
  ['sandbox', 'exec', '--agent', 'nobody', '--', 'true'],
  ['sandbox', 'exec', '--agent', 'free', '--timeout', '007', '--', 'true'],
  ['sandbox', 'exec', '--agent', 'free', '--config', '<HOME>/bad.yaml', '--', 'true'],
  ['sandbox', 'exec', '--agent', 'free', '--config', '<HOME>/missing.yaml', '--', 'true'],
  [],
  ['--help'],
  ['agent'],
  ['agent', '--help'],
  ['runs', '--help'],
  ['agent', 'list', '--help'],
  ['config'],
  ['sandbox', 'exec', '--help'],
  ['help'],
  ['help', 'runs'],
  ['nosuch'],
  ['agent', 'nosuch', '--help'],
  ['runs', 'x', '--help'],
  ['runs', '--json', '--help'],
  ['--version'],
  ['agent:list'],
  ['agent:list', '--help'],
]
const cases = process.argv.includes('--only-random') ? [] : plain.flatMap((argv) => envs.map((env) => ({argv, env})))
const heads = [
  ['agent', 'list'],
  ['runs'],
  ['config', 'check'],
  ['container', 'status'],
  ['send'],
  ['sandbox', 'exec'],
  ['agent:list'],
]
const tokens = [
  '--json',
  '--json=',
  '--config',
  '--config=',
  '--config=<HOME>/bad.yaml',
  '<HOME>/config.yaml',
  '-n',
  '5',
  '-n=5',
  '-n5',
  '--limit',
  '007',
  '-1',
  '--limit=-1',
  '--limit=0',
  '--limit=10001',
  '1e3',
  '+3',
  '--agent',
  'free',
  '--agent=free',
  '-a',
  'boxed',
  '--agent=ünï',
  '--',
  '-',
  'hello',
  '--help',
  '-h',
  '--version',
  '--unrestricted',
  '--channel',
  'x',
  '--timeout',
  'extra',
  '--bogus',
  '--no-json',
  '--agent=',
  '',
]
for (let k = 0; k < RANDOM; k++) {
  const argv = [...pick(heads), ...Array.from({length: Math.floor(rnd() * 5)}, () => pick(tokens))]
  cases.push({argv, env: pick(envs), ...(rnd() < 0.3 ? {stdin: pick(['', 'from stdin\n'])} : {})})
}

function run(script, c, home) {
  const argv = c.argv.map((word) => word.split('<HOME>').join(home))
  return new Promise((resolve) => {
    const child = spawn(process.execPath, ['--require', PROBE, script, ...argv], {
      cwd: home,
      env: {PATH: process.env.PATH, MEEPAGATEWAY_HOME: home, HOME: home, ...c.env},
      stdio: [c.stdin === undefined ? 'ignore' : 'pipe', 'pipe', 'pipe'],
    })
    const out = []
    const err = []
    child.stdout.on('data', (data) => out.push(data))
    child.stderr.on('data', (data) => err.push(data))
    if (c.stdin !== undefined) child.stdin.on('error', () => {}).end(c.stdin)
    const timer = setTimeout(() => child.kill('SIGKILL'), 30_000)
    child.on('close', (code, signal) => {
      clearTimeout(timer)
      const normal = (text) =>
        text
          .split(home)
          .join('<HOME>')
          .replace(/run_[0-9a-f]{16}/g, 'run_ID')
          .replace(/ *at async main \(\S*bin\/run\.js:\d+:\d+\)\n/g, '')
      const stderr = Buffer.concat(err).toString()
      resolve({
        code,
        signal,
        stdout: normal(Buffer.concat(out).toString()),
        stderr: normal(stderr.replace(/\n?FULL_CLI \w+\n?$/, '')),
        lite: !/FULL_CLI true/.test(stderr),
      })
    })
  })
}

let next = 0
let lite = 0
const diffs = []
async function worker() {
  while (next < cases.length) {
    const c = cases[next++]
    // the same home path for both ways (wrapped error text must match), fresh for each
    const home = path.join(work, `h${next}`)
    const fresh = () => {
      fs.rmSync(home, {recursive: true, force: true})
      fs.cpSync(template, home, {recursive: true})
    }
    fresh()
    const viaBin = await run(BIN, c, home)
    fresh()
    const viaOclif = await run(VIA_OCLIF, c, home)
    fs.rmSync(home, {recursive: true, force: true})
    if (viaBin.lite) lite++
    const same = ['code', 'signal', 'stdout', 'stderr'].every((key) => viaBin[key] === viaOclif[key])
    if (!same) {
      diffs.push({case: c, viaBin, viaOclif})
      console.log(`DIFF ${JSON.stringify(c)} (lite: ${viaBin.lite}; exit ${viaBin.code} vs ${viaOclif.code})`)
    }
  }
}
await Promise.all(Array.from({length: JOBS}, worker))
fs.rmSync(work, {recursive: true, force: true})
if (OUT) fs.writeFileSync(OUT, `${JSON.stringify(diffs, null, 1)}\n`)
console.log(`${cases.length} cases, ${lite} on a lite path, ${diffs.length} differ`)
process.exitCode = diffs.length > 0 ? 1 : 0
