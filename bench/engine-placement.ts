// Issue 24, Speed: placement adds at most 1 ms per message. What a message pays to be placed
// (placeRun and its release) with 16 listed engines, a quarter of them down and some busy,
// allowed all of them, against the same with the local engine alone (no `engines:` list) in
// the same run. No engine is reached: placement reads only what the watcher and the runs recorded.
//
//   npx tsx bench/engine-placement.ts        (BENCH_N: placements per sample, default 10000)
import {DockerCli} from '../src/sandbox/docker/cli.js'
import {markEngineDown, markEngineUp} from '../src/runtime/runners/container/engine-health.js'
import {placeRun, type DockerEngine} from '../src/runtime/runners/container/engines.js'
import {report, sample, stats} from './lib.js'

const N = Number(process.env.BENCH_N ?? 10_000)
const ENGINES = 16

const engine = (name: string, maxRuns: number): DockerEngine => ({
  name,
  cli: new DockerCli({engineArgs: ['--host', `tcp://127.0.0.1:${2376 + maxRuns}`]}),
  workspace: 'sync',
  maxRuns,
  ping: async () => {},
})
const many = Array.from({length: ENGINES}, (_, i) => engine(`engine-${i}`, 4 + i))
const alone = [engine('local', Number.POSITIVE_INFINITY)]
for (const [i, listed] of many.entries()) {
  if (i % 4 === 3) markEngineDown(listed.name, 'bench: not answering')
  else markEngineUp(listed.name)
}
// some engines busy: runs placed and held for the whole bench
const held = Array.from({length: 20}, () => placeRun(many, undefined))

/** Microseconds per placement (placed and released at once, as a message's run would be). */
const perPlacement = (engines: DockerEngine[]) => async () => {
  const started = performance.now()
  for (let i = 0; i < N; i++) placeRun(engines, undefined).release()
  return ((performance.now() - started) * 1000) / N
}
const listed = stats(await sample(20, perPlacement(many)))
const local = stats(await sample(20, perPlacement(alone)))
for (const run of held) run.release()
const addedMs = (listed.median - local.median) / 1000
console.error(
  `placement among ${ENGINES} engines: ${listed.median.toFixed(2)} µs, the local engine alone ${local.median.toFixed(2)} µs: +${(addedMs * 1000).toFixed(2)} µs per message (target <= 1 ms)`,
)
report('engine-placement', {
  target_added_ms: 1,
  engines: ENGINES,
  listed_us: listed,
  local_alone_us: local,
  added_ms: addedMs,
})
