// A `network: none` container on this machine's Docker engine as the runner now makes it (created
// over the Engine API with NetworkDisabled, attached with `docker start -ai`) against the
// `docker run --network none` of the same argv, interleaved in one run: the machine's CPU and the
// wall time from the start to the container's exit, per container. Target: ≤ 0.7× CPU.
//
// Usage: npx tsx bench/container-network-none.ts   (BENCH_N rounds, default 20; Docker, the
// base image of scripts/ci/docker-up.sh)
import {execa} from 'execa'
import fs from 'node:fs'
import os from 'node:os'
import path from 'node:path'
import {localEngineApi} from '../src/sandbox/docker/engine-api.js'
import {
  buildCreateRequest,
  buildDockerRunArgs,
  CONTAINER_HOSTS,
  type DockerRunSpec,
} from '../src/sandbox/docker/run-args.js'
import {fmt, report, stats} from './lib.js'

const N = Number(process.env.BENCH_N ?? 20)
const api = localEngineApi()
if (!api) throw new Error('needs the local Docker engine on its default socket')
const image = (await execa('docker', ['image', 'inspect', '--format', '{{.Id}}', 'debian:bookworm-slim'])).stdout
const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'meepa-bench-netnone-'))
const workspace = path.join(dir, 'workspace')
fs.mkdirSync(workspace)
const hostsFile = path.join(dir, 'hosts')
fs.writeFileSync(hostsFile, CONTAINER_HOSTS, {mode: 0o644})
const spec: Omit<DockerRunSpec, 'name'> = {
  image,
  workspace,
  uid: 65532,
  gid: 65532,
  memoryLimit: '256m',
  pidsLimit: 64,
  fileSizeLimit: 64 * 1024 * 1024,
  cpus: 1,
  network: 'none',
  listen: 'deny',
  labels: {'meepagateway.bench': 'network-none'},
  forwardEnv: [],
  entrypoint: '/bin/true',
  command: [],
}

/** Busy jiffies of the whole machine (user, nice, system, irq, softirq). */
function busyTicks(): number {
  const fields = fs.readFileSync('/proc/stat', 'utf8').split('\n')[0]!.trim().split(/\s+/).slice(1).map(Number)
  return fields[0]! + fields[1]! + fields[2]! + fields[5]! + fields[6]!
}
const TICK_MS = 1000 / Number((await execa('getconf', ['CLK_TCK'])).stdout)

async function measure(start: (name: string) => Promise<unknown>, name: string): Promise<{ms: number; cpu: number}> {
  const ticks = busyTicks()
  const started = performance.now()
  await start(name)
  const ms = performance.now() - started
  const cpu = (busyTicks() - ticks) * TICK_MS
  await execa('docker', ['rm', '-f', name], {reject: false})
  return {ms, cpu}
}

const byRun = (name: string) => execa('docker', buildDockerRunArgs({...spec, name}), {input: ''})
const byCreate = async (name: string) => {
  await api.createContainer(name, buildCreateRequest({...spec, name, hostsFile}, {}))
  await execa('docker', ['start', '--attach', '--interactive', name], {input: ''})
}

const run: Array<{ms: number; cpu: number}> = []
const created: Array<{ms: number; cpu: number}> = []
try {
  for (let i = 0; i < N + 2; i++) {
    const pair = [await measure(byRun, `meepa-bench-run-${i}`), await measure(byCreate, `meepa-bench-create-${i}`)]
    if (i < 2) continue // warm-up
    run.push(pair[0]!)
    created.push(pair[1]!)
  }
} finally {
  fs.rmSync(dir, {recursive: true, force: true})
}
const wall = {run: stats(run.map((x) => x.ms)), created: stats(created.map((x) => x.ms))}
const cpu = {run: stats(run.map((x) => x.cpu)), created: stats(created.map((x) => x.cpu))}
report('container-network-none', {
  rounds: N,
  wall,
  cpu,
  ratio_cpu: cpu.created.median / cpu.run.median,
  ratio_wall: wall.created.median / wall.run.median,
  summary: `per container, created with NetworkDisabled vs docker run --network none: CPU ${fmt(cpu.created.median)} vs ${fmt(cpu.run.median)} (${(cpu.created.median / cpu.run.median).toFixed(2)}x), wall ${fmt(wall.created.median)} vs ${fmt(wall.run.median)} (${(wall.created.median / wall.run.median).toFixed(2)}x)`,
})
