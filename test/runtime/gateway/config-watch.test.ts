import Database from 'better-sqlite3'
import fs from 'node:fs'
import path from 'node:path'
import YAML from 'yaml'
import {afterEach, describe, expect, it} from 'vitest'
import {localSendToken} from '../../../src/runtime/connectors/local-send/protocol.js'
import type {FakeLlm} from '../../fakes/llm-server.js'
import {fakeLlmForTests} from '../../helpers/fake-llm-for-tests.js'
import {freePort} from '../../helpers/free-port.js'
import {fakeLlmConfig, makeHome, runCli, type TestHome} from '../../helpers/home.js'
import {agentRunsIn} from '../../helpers/processes.js'
import {serveProcessesKilledAfterEach, startServeProcess, type ServeProcess} from '../../helpers/serve-process.js'
import {waitFor} from '../../helpers/wait-for.js'
import {requireLandlockOrSkip} from '../../helpers/landlock-support.js'

// `serve` watches config.yaml: a hand edit applies to each agent's next message (audited with
// source `file`), an invalid one is refused and logged, and the dashboard, `send`, `agent list`
// and the run records agree on each agent's level. All through the shipped bin/run.js serve.

let llm: FakeLlm
let home: TestHome | undefined

fakeLlmForTests((started) => (llm = started), {resetBeforeEach: true})
afterEach(() => {
  home?.cleanup()
  home = undefined
})
// registered after the clean-up: after-each hooks run last first, so each serve is gone before its home
const serves = serveProcessesKilledAfterEach()

const landlock = requireLandlockOrSkip('config edits that move an agent between the host sandbox and unrestricted')

/** What `send` runs with too (see test/gateway/local-send.test.ts), so the gateway can take its messages. */
const SEND_ENV = {MEEPA_RETRY_BASE_MS: '20'}
const SECRET = 'the operator secret 7f3a'

interface Setup {
  serve: ServeProcess
  adminKey: string
  secretPath: string
  config: (agent: Record<string, unknown>) => string
}

/**
 * A home whose one agent `a1` is as given, a secret file a sandboxed agent cannot read, an admin
 * key, and `serve` (no --unrestricted).
 */
async function setUp(agent: Record<string, unknown>): Promise<Setup> {
  const port = await freePort()
  const config = (fields: Record<string, unknown>) =>
    YAML.stringify(
      fakeLlmConfig(llm.openaiBaseUrl, [{id: 'a1', ...fields}], {captain: {enabled: true, bind: '127.0.0.1', port}}),
    )
  home = makeHome(config(agent))
  // in the home: a mandatory deny of the host sandbox, readable to an unrestricted run
  const secretPath = path.join(home.home, 'operator-secret.txt')
  fs.writeFileSync(secretPath, SECRET)
  const created = await runCli(['api-key', 'create', 'ops', '--admin', '--json'], {home: home.home})
  expect(created.exitCode, created.stderr).toBe(0)
  const serve = await startServeProcess({home: home.home, configPath: home.configPath, env: SEND_ENV, args: []})
  serves.push(serve.process)
  await waitFor('the send socket', () => fs.existsSync(localSendToken(home!.home)))
  return {serve, adminKey: (JSON.parse(created.stdout) as {key: string}).key, secretPath, config}
}

async function api(setup: Setup, method: string, route: string, body?: unknown): Promise<{status: number; body: any}> {
  const res = await fetch(setup.serve.url + route, {
    method,
    headers: {
      authorization: `Bearer ${setup.adminKey}`,
      ...(body === undefined ? {} : {'content-type': 'application/json'}),
    },
    body: body === undefined ? undefined : JSON.stringify(body),
  })
  return {status: res.status, body: await res.json()}
}

/** Asks a1 (web chat) to read the secret file; the reply is the tool's output. */
async function askForSecret(setup: Setup): Promise<{reply: string; isolation: string}> {
  llm.enqueue({toolCalls: [{name: 'shell', arguments: {command: `cat ${setup.secretPath}`}}]}, (request) => ({
    text: String(request.body.messages.at(-1).content),
  }))
  const chat = await api(setup, 'POST', '/api/chat', {agent: 'a1', message: 'read it'})
  expect(chat.status, JSON.stringify(chat.body)).toBe(200)
  return {reply: chat.body.reply as string, isolation: runRecord(chat.body.run_id as string).isolation}
}

type RunRow = {isolation: string; connector: string; status: string}

function runRow(where: string, ...values: string[]): RunRow | undefined {
  const db = new Database(path.join(home!.home, 'gateway.db'), {readonly: true})
  try {
    return db.prepare(`SELECT isolation, connector, status FROM runs WHERE ${where}`).get(...values) as
      RunRow | undefined
  } finally {
    db.close()
  }
}

const runRecord = (id: string) => runRow('id = ?', id) as RunRow
const runningRecord = () => runRow("status = 'running'")

async function auditEntries(): Promise<
  Array<{event: string; level: string; principal: string; source: string; summary: string}>
> {
  const result = await runCli(['audit', '--json'], {home: home!.home})
  expect(result.exitCode, result.stderr).toBe(0)
  return JSON.parse(result.stdout)
}

/** An editor that writes a new file and renames it over config.yaml (vim, most IDEs). */
function replaceByRename(text: string): void {
  const temp = `${home!.configPath}.swp-${process.pid}`
  fs.writeFileSync(temp, text)
  fs.renameSync(temp, home!.configPath)
}

const appliedCount = (serve: ServeProcess) => serve.output().match(/gateway: applied the change to /g)?.length ?? 0

describe.skipIf(!landlock)('serve and hand edits of config.yaml', {timeout: 120_000}, () => {
  it('a hand edit to unrestricted: the running run keeps the sandbox, the next message runs unrestricted, audited at WARNING from `file`, and every view agrees', async () => {
    const setup = await setUp({})
    expect(await askForSecret(setup)).toEqual({reply: expect.not.stringContaining(SECRET), isolation: 'host-sandbox'})

    // a run in flight when the edit lands: it sleeps through it, then tries the secret
    llm.enqueue(
      {toolCalls: [{name: 'shell', arguments: {command: 'sleep 1.5'}}]},
      {toolCalls: [{name: 'shell', arguments: {command: `cat ${setup.secretPath}`}}]},
      (request) => ({text: String(request.body.messages.at(-1).content)}),
    )
    const inFlight = api(setup, 'POST', '/api/chat', {agent: 'a1', message: 'slow read'})
    await waitFor('the run to start', () => llm.requests.length >= 3)
    fs.writeFileSync(home!.configPath, setup.config({file_access: {unrestricted: true}})) // in place
    await waitFor('the change applied', () => appliedCount(setup.serve) === 1)
    const slow = await inFlight
    expect(slow.body.reply).not.toContain(SECRET)
    expect(runRecord(slow.body.run_id).isolation).toBe('host-sandbox')

    expect(await askForSecret(setup)).toEqual({reply: expect.stringContaining(SECRET), isolation: 'unrestricted'})
    const entries = (await auditEntries()).filter((entry) => entry.event === 'config_change')
    expect(entries).toEqual([
      expect.objectContaining({
        level: 'warning',
        source: 'file',
        summary: expect.stringMatching(
          /^agent a1 changed: file_access: null → \{"unrestricted":true\} \(WEAKENS ISOLATION: isolation host-sandbox → unrestricted\)/,
        ),
      }),
    ])
    expect(setup.serve.output()).toMatch(/audit WARNING: agent a1 changed: .* \(by hand edit from file\)/)

    // the dashboard, agent list and send say and do the same
    const shown = await api(setup, 'GET', '/api/captain/agents/a1')
    expect(shown.body).toMatchObject({
      isolation: 'unrestricted',
      file_access: {unrestricted: true},
      configured: {file_access: {unrestricted: true}},
    })
    const listed = await runCli(['agent', 'list', '--json'], {home: home!.home})
    expect(JSON.parse(listed.stdout)).toMatchObject([{id: 'a1', isolation: 'unrestricted'}])
    llm.enqueue({toolCalls: [{name: 'shell', arguments: {command: `cat ${setup.secretPath}`}}]}, (request) => ({
      text: String(request.body.messages.at(-1).content),
    }))
    const sent = await runCli(['send', '--agent', 'a1', '--json', 'read it'], {home: home!.home, env: SEND_ENV})
    expect(sent.exitCode, sent.stderr).toBe(0)
    const output = JSON.parse(sent.stdout) as {run_id: string; reply: {content: string}}
    expect(output.reply.content).toContain(SECRET)
    expect(runRecord(output.run_id)).toMatchObject({connector: 'cli', isolation: 'unrestricted'}) // the gateway ran it
  })

  it('a message that waited in the queue while the edit landed runs at the new level, and its record says so while it runs', async () => {
    const setup = await setUp({})
    let recordWhileRunning: RunRow | undefined
    llm.enqueue(
      {toolCalls: [{name: 'shell', arguments: {command: 'sleep 2'}}]},
      {text: 'first done'},
      // the second message's first model call: its run is under way
      () => {
        recordWhileRunning = runningRecord()
        return {toolCalls: [{name: 'shell', arguments: {command: `cat ${setup.secretPath}`}}]}
      },
      (request) => ({text: String(request.body.messages.at(-1).content)}),
    )
    const first = api(setup, 'POST', '/api/chat', {agent: 'a1', message: 'slow'})
    await waitFor('the first run', () => llm.requests.length >= 1)
    const second = api(setup, 'POST', '/api/chat', {agent: 'a1', message: 'read it'})
    const waiting = async () =>
      ((await (await fetch(`${setup.serve.url}/healthz`)).json()) as {runs: {waiting: number}}).runs.waiting
    for (
      const deadline = Date.now() + 10_000;
      (await waiting()) !== 1;
      await new Promise((resolve) => setTimeout(resolve, 25))
    ) {
      if (Date.now() > deadline) throw new Error('the second message was never queued')
    }
    fs.writeFileSync(home!.configPath, setup.config({file_access: {unrestricted: true}}))
    await waitFor('the change applied', () => appliedCount(setup.serve) === 1)
    expect(runRecord((await first).body.run_id).isolation).toBe('host-sandbox')
    const done = await second
    expect(done.body.reply).toContain(SECRET)
    expect(recordWhileRunning).toEqual({isolation: 'unrestricted', connector: 'webchat', status: 'running'})
    expect(runRecord(done.body.run_id).isolation).toBe('unrestricted')
  })

  it('a standby agent-run waiting for an unrestricted agent ends when a hand edit sandboxes the agent', async () => {
    const setup = await setUp({file_access: {unrestricted: true}})
    llm.enqueue({text: 'hello'})
    expect((await api(setup, 'POST', '/api/chat', {agent: 'a1', message: 'hi'})).status).toBe(200)
    const [standby] = await waitFor('a standby agent-run', () => {
      const pids = agentRunsIn(home!.workspace('a1'))
      return pids.length === 1 && pids
    })
    fs.writeFileSync(home!.configPath, setup.config({}))
    await waitFor('the change applied', () => appliedCount(setup.serve) === 1)
    // an unrestricted process of an agent the operator has just sandboxed: gone at once, not after its idle time
    await waitFor('the standby to end', () => !fs.existsSync(`/proc/${standby}`), 5000)
    expect(await askForSecret(setup)).toEqual({reply: expect.not.stringContaining(SECRET), isolation: 'host-sandbox'})
  })

  it('send right after a hand edit runs in the gateway at the new level, before the watch has fired', async () => {
    const setup = await setUp({file_access: {unrestricted: true}})
    fs.writeFileSync(home!.configPath, setup.config({}))
    llm.enqueue({toolCalls: [{name: 'shell', arguments: {command: `cat ${setup.secretPath}`}}]}, (request) => ({
      text: String(request.body.messages.at(-1).content),
    }))
    const sent = await runCli(['send', '--agent', 'a1', '--json', 'read it'], {home: home!.home, env: SEND_ENV})
    expect(sent.exitCode, sent.stderr).toBe(0)
    const output = JSON.parse(sent.stdout) as {run_id: string; reply: {content: string}}
    expect(output.reply.content).not.toContain(SECRET)
    expect(runRecord(output.run_id)).toMatchObject({connector: 'cli', isolation: 'host-sandbox'})
    const entries = (await auditEntries()).filter((entry) => entry.event === 'config_change')
    expect(entries).toEqual([expect.objectContaining({level: 'info', source: 'file'})])
  })

  it('an editor that renames over the file: an invalid edit is refused and logged, the old config serves, the dashboard refuses to edit over it; fixed, it applies, and a dashboard edit after it audits only its own change', async () => {
    const setup = await setUp({})
    const refusedText = setup.config({name: 'Renamed', file_access: {unrestricted: 'yes'}})
    replaceByRename(refusedText)
    await waitFor('the refusal', () =>
      /gateway: config change refused, still serving the previous config: invalid config \S+config\.yaml \(1 problem\): agents\[0\]\.file_access\.unrestricted: must be boolean/.test(
        setup.serve.output(),
      ),
    )
    expect(await askForSecret(setup)).toEqual({reply: expect.not.stringContaining(SECRET), isolation: 'host-sandbox'})
    const shown = await api(setup, 'GET', '/api/captain/agents/a1')
    expect(shown.body).toMatchObject({name: 'a1', isolation: 'host-sandbox', configured: {id: 'a1'}})
    expect(shown.body.configured.file_access).toBeUndefined() // what runs, not the refused text
    expect((await api(setup, 'GET', '/api/captain/config')).body.refused).toMatch(
      /agents\[0\]\.file_access\.unrestricted: must be boolean/,
    )
    const patch = await api(setup, 'PATCH', '/api/captain/agents/a1', {max_iterations: 6})
    expect(patch.status).toBe(409)
    expect(patch.body.error.message).toMatch(/refused/)
    expect(fs.readFileSync(home!.configPath, 'utf8')).toBe(refusedText)
    expect(setup.serve.output().match(/config change refused/g)).toHaveLength(1) // logged once, not at every look

    replaceByRename(setup.config({name: 'Renamed'}))
    await waitFor('the fixed edit applied', () => appliedCount(setup.serve) === 1)
    expect((await api(setup, 'GET', '/api/captain/agents/a1')).body).toMatchObject({
      name: 'Renamed',
      isolation: 'host-sandbox',
    })
    expect((await api(setup, 'GET', '/api/captain/config')).body.refused).toBeNull()
    expect((await api(setup, 'PATCH', '/api/captain/agents/a1', {max_iterations: 6})).status).toBe(200)
    const entries = (await auditEntries()).filter((entry) => entry.event === 'config_change')
    expect(entries.map((entry) => [entry.source, entry.level, entry.summary])).toEqual([
      ['file', 'info', 'agent a1 changed: name: null → "Renamed"'],
      ['127.0.0.1', 'info', 'agent a1 changed: max_iterations: null → 6'],
    ])
    expect(YAML.parse(fs.readFileSync(home!.configPath, 'utf8')).agents[0]).toMatchObject({
      name: 'Renamed',
      max_iterations: 6,
    })
  })

  it('a dashboard edit right after a hand edit applies and audits the hand edit first', async () => {
    const setup = await setUp({})
    fs.writeFileSync(home!.configPath, setup.config({file_access: {unrestricted: true}}))
    const patch = await api(setup, 'PATCH', '/api/captain/agents/a1', {max_iterations: 6})
    expect(patch.status).toBe(200)
    expect(patch.body.agent.isolation).toBe('unrestricted')
    const entries = (await auditEntries()).filter((entry) => entry.event === 'config_change')
    expect(entries.map((entry) => [entry.source, entry.level])).toEqual([
      ['file', 'warning'],
      ['127.0.0.1', 'info'],
    ])
    expect(entries[1]?.summary).toBe('agent a1 changed: max_iterations: null → 6')
  })
})
