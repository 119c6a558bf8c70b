// Issue 24 target: with an unchanged 50 MB workspace, a message on a remote engine (mutual TLS
// over loopback: a second dockerd of the bench's own) costs at most 100 ms more than the same
// message on the local engine. Both cold (a container per message, no standby), through
// runMessage, interleaved, a fake LLM that answers at once. The remote path includes walking the
// workspace (nothing to send) and taking the run's change list back with `docker cp`. The target's
// baseline is the same dockerd reached over its unix socket (`own_unix`): what remains is what
// being remote costs (TLS, the sync); the shared local engine is reported beside it. The same
// dockerd reached over ssh:// (an sshd of the bench's own on 127.0.0.1) is measured too, as its
// ratio to the local engine (no target of its own: each docker call is one ssh connection).
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
import {fmt, report, sample, stats} from './lib.js'

const N = Number(process.env.BENCH_N ?? 10)
const WORKSPACE_MB = 50

const engine = await startOwnEngine({tls: true, port: await freePort()})
const sshd = await startOwnSshd({dockerHost: engine.host})
const llm = await startFakeLlm()
llm.setDefault({text: 'ok'})
const home = fs.mkdtempSync(path.join(os.tmpdir(), 'meepa-bench-remote-'))
try {
  const tls = engine.tls!
  const configPath = path.join(home, 'config.yaml')
  const agent = (id: string, engines: string[]) => ({
    id,
    container_mode: {enabled: true, network: 'none', standby: false, engines},
  })
  fs.writeFileSync(
    configPath,
    YAML.stringify(
      fakeLlmConfig(
        llm.openaiBaseUrl,
        [agent('near', ['local']), agent('far', ['remote']), agent('own', ['own-unix']), agent('viassh', ['ssh'])],
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
  for (const id of ['near', 'far', 'own', 'viassh']) {
    const dir = path.join(home, 'agents', id)
    fs.mkdirSync(dir, {recursive: true})
    for (let i = 0; i < WORKSPACE_MB; i++)
      fs.writeFileSync(path.join(dir, `blob-${i}.bin`), crypto.randomBytes(1 << 20))
  }
  const sendToReply = async (agentId: string) => {
    const started = performance.now()
    const result = await runMessage({
      loaded,
      agentId,
      message: {id: 'm', connector: 'cli', channel_id: 'bench', user: {id: 'u', name: 'u'}, content: 'hi'},
      onLog: () => {},
    })
    if (!result.output.ok) throw new Error(`bench run failed: ${JSON.stringify(result.output.error)}`)
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
    `remote ${fmt(remote.median)}, same dockerd over unix ${fmt(ownUnix.median)}: +${fmt(added)} (target <= 100 ms); shared local engine ${fmt(local.median)}; over ssh:// ${fmt(ssh.median)} (${(ssh.median / local.median).toFixed(2)}× local)`,
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
  })
} finally {
  await llm.close()
  sshd.destroy()
  await engine.destroy()
  unmountBelow(home) // the workspaces' volumes (limits.disk)
  fs.rmSync(home, {recursive: true, force: true})
}
