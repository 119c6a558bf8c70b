// Issue 24 target: with an unchanged 50 MB workspace, a message on a remote engine (mutual TLS
// over loopback: a second dockerd of the bench's own) costs at most 100 ms more than the same
// message on the local engine. Both cold (a container per message, no standby), through
// runMessage, interleaved, a fake LLM that answers at once. The remote path includes walking the
// workspace (nothing to send) and taking the run's change list back with `docker cp`. The target's
// baseline is the same dockerd reached over its unix socket (`own_unix`): what remains is what
// being remote costs (TLS, the sync); the shared local engine is reported beside it. The same
// dockerd reached over ssh:// (an sshd of the bench's own on 127.0.0.1) is measured too, as its
// ratio to the local engine (no target of its own: each docker call is one ssh connection).
//
// Then the same with standbys (issue 24, Speed): runMessage with `standby: true`, the path a
// running gateway takes, each message served by the standby container its agent's previous run
// left on its engine (messages are spaced so that it is ready, as between a user's messages).
// Target: remote ≤ 1.2× the same message on the same dockerd over its unix socket; the shared
// local engine beside it. Reported as the ratio of the medians and as the median of each round's
// ratio (a pair 2.5 s apart). BENCH_STANDBY_N sets the standby rounds (default: 20, or BENCH_N).
import crypto from 'node:crypto'
import fs from 'node:fs'
import os from 'node:os'
import path from 'node:path'
import YAML from 'yaml'
import {startFakeLlm} from '../test/fakes/llm-server.js'
import {freePort} from '../test/helpers/free-port.js'
import {fakeLlmConfig, unmountBelow} from '../test/helpers/home.js'
import {startOwnEngine} from '../test/helpers/own-engine.js'
import {startOwnSshd} from '../test/helpers/own-sshd.js'
import {loadConfig} from '../src/runtime/config/load.js'
import {runMessage} from '../src/runtime/runners/run-message.js'
import {stopStandbyContainers} from '../src/runtime/runners/container/standby-pool.js'
import {fmt, report, sample, stats} from './lib.js'

const N = Number(process.env.BENCH_N ?? 10)
/** Standby rounds (7.5 s each): more than the cold ones, as their few milliseconds move with the machine's load. */
const STANDBY_N = Number(process.env.BENCH_STANDBY_N ?? Math.max(N, 20))
const WORKSPACE_MB = 50
/** Between standby rounds: time for each agent's next container to start and its agent-run to load. */
const STANDBY_READY_MS = 2_500

const engine = await startOwnEngine({tls: true, port: await freePort()})
const sshd = await startOwnSshd({dockerHost: engine.host})
const llm = await startFakeLlm()
llm.setDefault({text: 'ok'})
const home = fs.mkdtempSync(path.join(os.tmpdir(), 'meepa-bench-remote-'))
try {
  const tls = engine.tls!
  const configPath = path.join(home, 'config.yaml')
  const agent = (id: string, engines: string[], standby = false) => ({
    id,
    container_mode: {enabled: true, network: 'none', standby, engines},
  })
  fs.writeFileSync(
    configPath,
    YAML.stringify(
      fakeLlmConfig(
        llm.openaiBaseUrl,
        [
          agent('near', ['local']),
          agent('far', ['remote']),
          agent('own', ['own-unix']),
          agent('viassh', ['ssh']),
          agent('near-w', ['local'], true),
          agent('far-w', ['remote'], true),
          agent('own-w', ['own-unix'], true),
        ],
        {
          engines: [
            {name: 'remote', host: tls.host, tls: {ca: tls.ca, cert: tls.cert, key: tls.key}},
            {name: 'local', host: process.env.DOCKER_HOST || 'unix:///var/run/docker.sock'},
            {name: 'own-unix', host: engine.host},
            {name: 'ssh', host: sshd.host, ssh: {known_hosts: sshd.knownHosts, identity: sshd.identity}},
          ],
        },
      ),
    ),
  )
  process.env.FAKE_LLM_KEY = 'sk-bench-key-123456' // the name fakeLlmConfig's provider reads
  const loaded = loadConfig({configPath, home})
  // 50 files of 1 MB each, the same in both workspaces
  for (const id of ['near', 'far', 'own', 'viassh', 'near-w', 'far-w', 'own-w']) {
    const dir = path.join(home, 'agents', id)
    fs.mkdirSync(dir, {recursive: true})
    for (let i = 0; i < WORKSPACE_MB; i++)
      fs.writeFileSync(path.join(dir, `blob-${i}.bin`), crypto.randomBytes(1 << 20))
  }
  let fromStandby = 0
  /** BENCH_PROFILE=1: when each log line of a message came, in ms from its start (the last message of each agent; `all`: every standby message as it ends). */
  const timeline = new Map<string, string[]>()
  const sendToReply = async (agentId: string, standby = false) => {
    const started = performance.now()
    const lines: string[] = []
    timeline.set(agentId, lines)
    const result = await runMessage({
      loaded,
      agentId,
      message: {id: 'm', connector: 'cli', channel_id: 'bench', user: {id: 'u', name: 'u'}, content: 'hi'},
      standby,
      onLog: (line) => {
        lines.push(`${(performance.now() - started).toFixed(0).padStart(5)} ms  ${line.slice(0, 120)}`)
        if (line.startsWith('running in standby container')) fromStandby++
      },
    })
    if (!result.output.ok) throw new Error(`bench run failed: ${JSON.stringify(result.output.error)}`)
    lines.push(`${(performance.now() - started).toFixed(0).padStart(5)} ms  (reply)`)
    if (process.env.BENCH_PROFILE === 'all' && standby) console.error(`${agentId}:\n  ${lines.join('\n  ')}`)
    return performance.now() - started
  }
  // first runs: images built (the remote one there), the 50 MB copied to the remote volume once
  await sendToReply('near')
  await sendToReply('far')
  await sendToReply('own')
  await sendToReply('viassh')
  const times = {local: [] as number[], remote: [] as number[], own: [] as number[], ssh: [] as number[]}
  await sample(
    N,
    async () => {
      times.local.push(await sendToReply('near'))
      times.remote.push(await sendToReply('far'))
      times.own.push(await sendToReply('own'))
      times.ssh.push(await sendToReply('viassh'))
    },
    0,
  )
  const [local, remote, ownUnix, ssh] = [stats(times.local), stats(times.remote), stats(times.own), stats(times.ssh)]
  const added = remote.median - ownUnix.median
  console.error(
    `cold: remote ${fmt(remote.median)}, same dockerd over unix ${fmt(ownUnix.median)}: +${fmt(added)} (target <= 100 ms); shared local engine ${fmt(local.median)}; over ssh:// ${fmt(ssh.median)} (${(ssh.median / local.median).toFixed(2)}× local)`,
  )

  const profile = () => {
    if (!process.env.BENCH_PROFILE) return
    for (const [agentId, lines] of timeline) console.error(`${agentId}:\n  ${lines.join('\n  ')}`)
  }
  profile()

  // standbys: each agent's first message leaves its standby; each round then uses them
  for (const id of ['near-w', 'far-w', 'own-w']) await sendToReply(id, true)
  const warm = {local: [] as number[], remote: [] as number[], own: [] as number[]}
  fromStandby = 0
  // each message after a pause: the previous one's standby is not still starting beside it
  const spaced = async (agentId: string) => {
    await new Promise((resolve) => setTimeout(resolve, STANDBY_READY_MS))
    return sendToReply(agentId, true)
  }
  await sample(
    STANDBY_N,
    async () => {
      warm.local.push(await spaced('near-w'))
      warm.remote.push(await spaced('far-w'))
      warm.own.push(await spaced('own-w'))
    },
    0,
  )
  profile()
  const [warmLocal, warmRemote, warmOwn] = [stats(warm.local), stats(warm.remote), stats(warm.own)]
  const ratio = warmRemote.median / warmOwn.median
  // each round's remote message against the unix one 2.5 s later: a slow moment of the machine
  // weighs on both sides of a pair, where it moves one median alone
  const paired = stats(warm.remote.map((time, i) => time / warm.own[i]!)).median
  console.error(
    `standby: remote ${fmt(warmRemote.median)}, same dockerd over unix ${fmt(warmOwn.median)}: ${ratio.toFixed(2)}x, per round ${paired.toFixed(2)}x (target <= 1.2x); shared local engine ${fmt(warmLocal.median)} (${(warmRemote.median / warmLocal.median).toFixed(2)}x); ${fromStandby} of ${3 * STANDBY_N} from a standby`,
  )
  report('remote-engine', {
    target_added_ms: 100,
    workspace_mb: WORKSPACE_MB,
    remote,
    own_unix: ownUnix,
    local,
    added_ms: added,
    ssh,
    ssh_vs_local: ssh.median / local.median,
    standby: {
      target_ratio: 1.2,
      remote: warmRemote,
      own_unix: warmOwn,
      local: warmLocal,
      ratio,
      paired_ratio: paired,
      ratio_to_local: warmRemote.median / warmLocal.median,
      from_standby: fromStandby,
      messages: 3 * STANDBY_N,
    },
  })
} finally {
  await stopStandbyContainers()
  await llm.close()
  sshd.destroy()
  await engine.destroy()
  unmountBelow(home) // the workspaces' volumes (limits.disk)
  fs.rmSync(home, {recursive: true, force: true})
}
