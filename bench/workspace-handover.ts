// Issue 27, acceptance 4: the event loop never waits on a run's files. A root gateway hands a
// container agent's workspace to the container's uid (chown -R -P -h) before a run when a run as
// root had it since; with a hostile 300,000-file workspace that walk once held the event loop for
// seconds (/healthz 2.2 s, another agent's 3 s job 5.4 s). Measured against `meepagateway serve`
// (dist/, root, the local Docker engine):
// - /healthz answer times, asked one after another, while the hostile agent's message is handed
//   over and run, against the same with nothing else running (target p99 ≤ 100 ms);
// - another agent's job (JOB_TURNS LLM turns through the gateway, each running a shell command; its
//   run records go to the gateway's database on the disk the hostile volume's image is on), run
//   one after another from when the walk starts until it ends (a job that ends after the walk does
//   not count: the hostile container's start is not the hand-over), against ALONE_JOBS of the same
//   job alone right before and after (the gateway idle), round by round (target ≤ 1.1×).
// Before each loaded round the whole workspace is given back to root, as a host-sandbox run's
// reclaim leaves it, and flushed to disk: every hand-over re-owns all 300,000 entries.
import {execa, execaSync} from 'execa'
import fs from 'node:fs'
import os from 'node:os'
import path from 'node:path'
import YAML from 'yaml'
import {startFakeLlm, type FakeRequest} from '../test/fakes/llm-server.js'
import {freePort} from '../test/helpers/free-port.js'
import {fmt, report, ROOT, stats} from './lib.js'

if (process.getuid?.() !== 0)
  throw new Error('bench/workspace-handover.ts needs root: only a root gateway hands workspaces over')
const FILES = Number(process.env.BENCH_FILES ?? 300_000)
const ROUNDS = Number(process.env.BENCH_ROUNDS ?? 5)
const JOB_TURNS = 6
/** Jobs alone before and after each round's hand-over. */
const ALONE_JOBS = 3
/** 50–300 ms of shell arithmetic per turn on the project machine: a job that needs CPU and the gateway. */
const JOB_COMMAND = 'i=0; while [ $i -lt 60000 ]; do i=$((i+1)); done; echo $i'
const PER_DIRECTORY = 1000
const bin = path.join(ROOT, 'bin', 'run.js')
const env = {FAKE_LLM_KEY: 'sk-bench-key-123456', PATH: process.env.PATH ?? '/usr/bin:/bin'}

const llm = await startFakeLlm()
const toolResults = (request: FakeRequest) =>
  (request.body.messages as Array<{role: string}>).filter((message) => message.role === 'tool').length
const firstUserText = (request: FakeRequest) =>
  String(
    (request.body.messages as Array<{role: string; content: unknown}>).find((message) => message.role === 'user')
      ?.content ?? '',
  )
llm.setDefault((request) =>
  firstUserText(request).includes('job') && toolResults(request) < JOB_TURNS
    ? {toolCalls: [{name: 'shell', arguments: {command: JOB_COMMAND}}]}
    : {text: 'ok'},
)

const port = await freePort()
const home = fs.mkdtempSync(path.join(os.tmpdir(), 'meepa-bench-handover-'))
const outside = fs.mkdtempSync(path.join(os.tmpdir(), 'meepa-bench-handover-outside-'))
const configPath = path.join(home, 'config.yaml')
fs.writeFileSync(
  configPath,
  YAML.stringify({
    providers: {
      primary: 'fake',
      providers: {fake: {kind: 'openai', api_key_env: 'FAKE_LLM_KEY', model: 'm', base_url: llm.openaiBaseUrl}},
    },
    agents: [
      {id: 'hostile', container_mode: {enabled: true, network: 'none', standby: false}, limits: {disk: '8g'}},
      {id: 'other', file_access: {unrestricted: true}},
    ],
    captain: {enabled: true, bind: '127.0.0.1', port},
  }),
)

// the hostile workspace: FILES files, a deep tree, planted links to a file outside, FIFOs, hostile names
const workspace = path.join(home, 'agents', 'hostile')
let stopServe = (): void => {}
/** The agents' volumes (each with its loop device) and the scratch directories, also when the bench fails. */
function removeHomes(): void {
  stopServe() // a failed bench leaves no gateway holding the volumes
  for (const id of ['hostile', 'other']) execaSync('umount', ['-l', path.join(home, 'agents', id)], {reject: false})
  fs.rmSync(home, {recursive: true, force: true})
  fs.rmSync(outside, {recursive: true, force: true})
}
process.once('exit', removeHomes)
const victim = path.join(outside, 'victim')
fs.writeFileSync(victim, "the operator's")
const filled = performance.now()
// under root the workspace is a volume of limits.disk (src/runtime/workspace/volume.ts): made first,
// so the files land in it, as an agent's would
execaSync(process.execPath, [bin, 'agent', 'create', 'hostile'], {env: {...env, MEEPAGATEWAY_HOME: home}})
execaSync('/bin/sh', [
  '-c',
  `cd "$1" && for d in $(seq ${Math.ceil(FILES / PER_DIRECTORY)}); do mkdir "d$d" && (cd "d$d" && seq ${PER_DIRECTORY} | xargs touch); done`,
  'sh',
  workspace,
])
let deep = workspace
for (let level = 0; level < 15; level++) deep = path.join(deep, 'x'.repeat(200))
fs.mkdirSync(deep, {recursive: true})
fs.symlinkSync(victim, path.join(deep, 'link-out'))
for (const name of ['link-out', '-rf', 'new\nline', ' space ']) fs.symlinkSync(victim, path.join(workspace, 'd1', name))
execaSync('mkfifo', [path.join(workspace, 'd2', 'fifo')])
process.stderr.write(`workspace filled in ${fmt(performance.now() - filled)}\n`)

const key = JSON.parse(
  (
    await execa(process.execPath, [bin, 'api-key', 'create', 'bench', '--json'], {
      env: {...env, MEEPAGATEWAY_HOME: home},
    })
  ).stdout,
).key as string
let output = ''
const serve = execa(process.execPath, [bin, 'serve', '--config', configPath], {
  env: {...env, MEEPAGATEWAY_HOME: home},
  reject: false,
})
stopServe = () => void (serve.exitCode === null && serve.kill('SIGKILL'))
serve.stdout?.on('data', (chunk) => (output += String(chunk)))
serve.stderr?.on('data', (chunk) => (output += String(chunk)))
while (!output.includes('listening on')) {
  if (serve.exitCode !== null) throw new Error(`serve exited:\n${output}`)
  await new Promise((resolve) => setTimeout(resolve, 50))
}
const base = `http://127.0.0.1:${port}`

const chat = async (agent: string, message: string) => {
  const started = performance.now()
  const response = await fetch(`${base}/api/chat`, {
    method: 'POST',
    headers: {authorization: `Bearer ${key}`, 'content-type': 'application/json'},
    body: JSON.stringify({agent, message, channel: `${agent}-${Math.random()}`}),
  })
  const body = (await response.json()) as {reply?: string}
  if (response.status !== 200)
    throw new Error(`${agent}: ${response.status} ${JSON.stringify(body)}\n${output.slice(-2000)}`)
  return performance.now() - started
}

/** /healthz asked one after another until `until` settles; the answer times. */
const pollHealthz = async (until: Promise<unknown>) => {
  let done = false
  void until.finally(() => (done = true))
  const times: number[] = []
  while (!done) {
    const asked = performance.now()
    const response = await fetch(`${base}/healthz`)
    await response.arrayBuffer()
    times.push(performance.now() - asked)
  }
  return times
}

/** Resolves when a chown of the workspace is running (the hand-over started). */
const handoverStarted = async (deadline: number) => {
  while (performance.now() < deadline) {
    for (const pid of fs.readdirSync('/proc').filter((name) => /^\d+$/.test(name))) {
      try {
        const argv = fs.readFileSync(`/proc/${pid}/cmdline`, 'utf8').split('\0')
        if (argv[0]?.endsWith('chown') && argv.includes(workspace)) return performance.now()
      } catch {
        // exited meanwhile
      }
    }
    await new Promise((resolve) => setTimeout(resolve, 5))
  }
  throw new Error('the hand-over did not start')
}

/**
 * Waits until the gateway has been idle (under 10% of a core) for half a second: a run's end (its
 * disk measurement) is behind it.
 */
const settled = async () => {
  const ticks = () =>
    fs
      .readFileSync(`/proc/${serve.pid}/stat`, 'utf8')
      .split(') ')[1]!
      .split(' ')
      .slice(11, 13)
      .reduce((sum, field) => sum + Number(field), 0)
  for (let before = ticks(); ;) {
    await new Promise((resolve) => setTimeout(resolve, 500))
    const now = ticks()
    if (now - before < 5) return
    before = now
  }
}

const p99 = (samples: number[]) =>
  [...samples].sort((a, b) => a - b)[Math.min(samples.length - 1, Math.floor(0.99 * samples.length))] as number

// warm-up: the isolation image, the first hand-over (root-owned files), one job
for (let attempt = 1; ; attempt++) {
  // another test on the machine may remove the isolation image between its build and the run
  const failed = await chat('hostile', 'hi').then(
    () => undefined,
    (error: Error) => error,
  )
  if (!failed) break
  if (attempt === 3) throw failed
}
await chat('other', 'job')

/** The job `count` times one after another, with the gateway idle before; /healthz asked throughout. */
const jobsAlone = async (count: number) => {
  await settled()
  const times: number[] = []
  for (let index = 0; index < count; index++) {
    const job = chat('other', 'job')
    alone.healthz.push(...(await pollHealthz(job)))
    times.push(await job)
  }
  return times
}

const alone = {job: [] as number[], healthz: [] as number[]}
const loaded = {job: [] as number[], healthz: [] as number[], walkMs: [] as number[], hostileRunMs: [] as number[]}
/** Per round: the median job during the walk over the median job alone just before and just after. */
const ratios: number[] = []
const loads: number[] = []
for (let round = 0; round < ROUNDS; round++) {
  const before = await jobsAlone(ALONE_JOBS)

  // as a run as root leaves it (its reclaim walked every entry): the hand-over re-owns every one
  await execa('chown', ['-R', '-P', '-h', '0:0', '--', workspace])
  await execa('sync')
  await settled()
  loads.push(os.loadavg()[0]!)
  const hostileSent = performance.now()
  // its run after the walk may fail (another test on the machine removing the isolation image):
  // the walk was measured, and the next round's run builds the image again before it walks
  const hostile = chat('hostile', 'hi').catch((error: Error) => {
    process.stderr.write(`round ${round + 1}: the hostile run failed after its walk: ${error.message.split('\n')[0]}\n`)
    return NaN
  })
  const healthz = pollHealthz(hostile)
  const walkStarted = await handoverStarted(performance.now() + 300_000)
  let walkEnded: number | undefined
  let hostileDone = false
  void hostile.finally(() => (hostileDone = true))
  const walked = (async () => {
    while (fs.lstatSync(workspace).uid === 0 && !hostileDone) await new Promise((resolve) => setTimeout(resolve, 5))
    walkEnded = performance.now()
    if (fs.lstatSync(workspace).uid === 0) process.stderr.write(`round ${round + 1}: the walk did not finish\n`)
    return walkEnded - walkStarted
  })()
  // jobs one after another while the walk runs; one that ends after it does not count
  const during: number[] = []
  while (walkEnded === undefined) {
    const took = await chat('other', 'job')
    if (walkEnded === undefined) during.push(took)
  }
  loaded.walkMs.push(await walked)
  const hostileMs = await hostile
  if (!Number.isNaN(hostileMs)) loaded.hostileRunMs.push(hostileMs)
  loaded.healthz.push(...(await healthz))
  loaded.job.push(...during)

  const after = await jobsAlone(ALONE_JOBS)
  alone.job.push(...before, ...after)
  const ratio = during.length > 0 ? stats(during).median / stats([...before, ...after]).median : NaN
  ratios.push(ratio)
  process.stderr.write(
    `round ${round + 1} (load ${loads.at(-1)!.toFixed(1)}): job alone ${before.map(fmt).join(', ')} before and ${after.map(fmt).join(', ')} after, during the walk ${during.map(fmt).join(', ') || 'none (the walk was shorter than a job)'}: ${ratio.toFixed(2)}×; walk ${fmt(loaded.walkMs.at(-1)!)}, hostile run ${fmt(performance.now() - hostileSent)}\n`,
  )
}

serve.kill('SIGTERM')
await serve
const victimUntouched = fs.statSync(victim).uid === 0
process.off('exit', removeHomes)
removeHomes()
await llm.close()
if (!victimUntouched) throw new Error('a planted link was followed: the file outside the workspace changed owner')

const jobAlone = stats(alone.job)
const jobLoaded = stats(loaded.job)
report('workspace-handover', {
  files: FILES,
  rounds: ROUNDS,
  healthz_during_handover_ms: {
    p50: +stats(loaded.healthz).median.toFixed(1),
    p99: +p99(loaded.healthz).toFixed(1),
    max: +stats(loaded.healthz).max.toFixed(1),
    n: loaded.healthz.length,
  },
  healthz_idle_ms: {
    p50: +stats(alone.healthz).median.toFixed(1),
    p99: +p99(alone.healthz).toFixed(1),
    max: +stats(alone.healthz).max.toFixed(1),
    n: alone.healthz.length,
  },
  other_job_ms: {
    alone: +jobAlone.median.toFixed(0),
    during_handover: +jobLoaded.median.toFixed(0),
    ratio: +(jobLoaded.median / jobAlone.median).toFixed(3),
    ratio_per_round: ratios.map((ratio) => +ratio.toFixed(2)),
    n_alone: alone.job.length,
    n_during: loaded.job.length,
  },
  load_average_per_round: loads.map((load) => +load.toFixed(1)),
  load_average_end: +os.loadavg()[0]!.toFixed(1),
  walk_ms: +stats(loaded.walkMs).median.toFixed(0),
  hostile_run_ms: +stats(loaded.hostileRunMs).median.toFixed(0),
  targets: {healthz_p99_ms: 100, job_ratio: 1.1},
})
