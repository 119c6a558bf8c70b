import fs from 'node:fs'
import path from 'node:path'
import {afterEach, describe, expect, it} from 'vitest'
import type {FakeLlm} from '../fakes/llm-server.js'
import {fakeLlmForTests} from '../helpers/fake-llm-for-tests.js'
import {fakeLlmConfig, makeHome, runCli, type TestHome} from '../helpers/home.js'
import {serveProcessesKilledAfterEach, startServeProcess} from '../helpers/serve-process.js'
import {describeWithDocker} from '../helpers/docker-env.js'

/*
 * Files an agent sends, end to end: `bin/run.js serve`, a web chat request, a real agent-run at
 * each isolation level (a standby container included) that writes a report, sends it, and then
 * plays hostile with the other files it named: a FIFO and a symbolic link swapped in after
 * send_file checked them, and a hard link. The gateway reads the files after the run: only the
 * report comes back; the rest are named in the reply and in `runs`.
 */

const REPORT = 'quarterly numbers\n'
let llm: FakeLlm
fakeLlmForTests((started) => (llm = started))
const homes: TestHome[] = []
afterEach(() => {
  for (const home of homes.splice(0)) home.cleanup()
})
// registered after the homes' cleanup: after-hooks run in reverse, so serve is killed first
const serves = serveProcessesKilledAfterEach()

function scriptHostileSender(): void {
  llm.enqueue(
    {
      toolCalls: [
        // what a previous message left (a FIFO would block write_file itself)
        {name: 'shell', arguments: {command: 'rm -f pipe.txt link.txt orig.txt hard.txt'}},
        {name: 'write_file', arguments: {path: 'out/report.txt', content: REPORT}},
        {name: 'send_file', arguments: {path: 'out/report.txt'}},
        {name: 'write_file', arguments: {path: 'pipe.txt', content: 'x'}},
        {name: 'send_file', arguments: {path: 'pipe.txt'}},
        {name: 'write_file', arguments: {path: 'link.txt', content: 'x'}},
        {name: 'send_file', arguments: {path: 'link.txt'}},
        {name: 'write_file', arguments: {path: 'orig.txt', content: 'x'}},
        {name: 'send_file', arguments: {path: 'orig.txt'}},
        {
          name: 'shell',
          arguments: {
            command: 'rm pipe.txt link.txt && mkfifo pipe.txt && ln -s /etc/hostname link.txt && ln orig.txt hard.txt',
          },
        },
      ],
    },
    {text: 'Sent.'},
  )
}

async function serveAgent(agent: Record<string, unknown>) {
  const home = makeHome(fakeLlmConfig(llm.openaiBaseUrl, [{id: 'a', ...agent}]))
  homes.push(home)
  const serve = await startServeProcess({home: home.home, configPath: home.configPath, args: [], timeoutMs: 280_000})
  serves.push(serve.process)
  const created = await runCli(['api-key', 'create', 'tests', '--json'], {home: home.home})
  const key = JSON.parse(created.stdout).key as string
  const chat = async () => {
    llm.reset()
    scriptHostileSender()
    const response = await fetch(`${serve.url}/api/chat`, {
      method: 'POST',
      headers: {authorization: `Bearer ${key}`, 'content-type': 'application/json'},
      body: JSON.stringify({agent: 'a', message: 'send me the report'}),
    })
    return {status: response.status, body: (await response.json()) as any}
  }
  return {home, serve, chat, key}
}

async function expectOnlyTheReport(served: Awaited<ReturnType<typeof serveAgent>>, level: string) {
  const {status, body} = await served.chat()
  expect(status, `${JSON.stringify(body)}\n${served.serve.output()}`).toBe(200)
  expect(body.files).toEqual([
    {
      name: 'report.txt',
      size: REPORT.length,
      content_type: 'text/plain',
      content_base64: Buffer.from(REPORT).toString('base64'),
    },
  ])
  expect(body.reply).toBe(
    [
      'Sent.',
      '',
      '(File not sent: pipe.txt: it is a FIFO.)',
      '(File not sent: link.txt: it is a symbolic link.)',
      '(File not sent: orig.txt: it has 1 other hard link(s) and may be a file from outside the workspace.)',
    ].join('\n'),
  )
  const runs = JSON.parse((await runCli(['runs', '--json', '-n', '1'], {home: served.home.home})).stdout)
  expect(runs[0]).toMatchObject({id: body.run_id, isolation: level, status: 'ok'})
  expect(runs[0].files).toEqual([
    {direction: 'out', name: 'report.txt', size: REPORT.length, content_type: 'text/plain', skipped_reason: null},
    {direction: 'out', name: 'pipe.txt', size: null, content_type: null, skipped_reason: 'it is a FIFO'},
    {direction: 'out', name: 'link.txt', size: null, content_type: null, skipped_reason: 'it is a symbolic link'},
    expect.objectContaining({name: 'orig.txt', skipped_reason: expect.stringMatching(/hard link/)}),
  ])
  const table = (await runCli(['runs', '-n', '1'], {home: served.home.home})).stdout
  expect(table).toContain(`  out "report.txt" ${REPORT.length} B text/plain\n`)
  expect(table).toContain('  out "pipe.txt" - not sent: it is a FIFO')
  return body
}

describe('files an agent sends, through serve and web chat (bin/run.js)', {timeout: 300_000}, () => {
  it('unrestricted', async () => {
    await expectOnlyTheReport(await serveAgent({file_access: {unrestricted: true}}), 'unrestricted')
  })

  it('host sandbox', async () => {
    await expectOnlyTheReport(await serveAgent({}), 'host-sandbox')
  })

  for (const level of ['host-sandbox', 'unrestricted'] as const) {
    it(`never sends a file the agent's own file_access.deny covers (${level})`, async () => {
      const deny = ['secret.txt', 'keys']
      const served = await serveAgent({file_access: level === 'unrestricted' ? {unrestricted: true, deny} : {deny}})
      const workspace = path.join(served.home.home, 'agents', 'a')
      fs.mkdirSync(path.join(workspace, 'keys'), {recursive: true})
      fs.writeFileSync(path.join(workspace, 'secret.txt'), 'SECRET=operator-only\n')
      fs.writeFileSync(path.join(workspace, 'keys', 'api.key'), 'KEY=operator-only\n')
      llm.reset()
      // in the host sandbox the run sees an empty file over secret.txt; the gateway must not read the real one
      llm.enqueue(
        {
          toolCalls: [
            {name: 'send_file', arguments: {path: 'secret.txt'}},
            {name: 'send_file', arguments: {path: 'keys/api.key'}},
            {name: 'write_file', arguments: {path: 'out/report.txt', content: REPORT}},
            {name: 'send_file', arguments: {path: 'out/report.txt'}},
          ],
        },
        {text: 'Sent.'},
      )
      const response = await fetch(`${served.serve.url}/api/chat`, {
        method: 'POST',
        headers: {authorization: `Bearer ${served.key}`, 'content-type': 'application/json'},
        body: JSON.stringify({agent: 'a', message: 'send me the secrets'}),
      })
      const body = (await response.json()) as any
      expect(response.status, JSON.stringify(body)).toBe(200)
      expect(JSON.stringify(body)).not.toMatch(/operator-only|U0VDUkVU|S0VZPW/)
      expect(body.files.map((file: {name: string}) => file.name)).toEqual(['report.txt'])
      expect(body.reply).toContain("(File not sent: secret.txt: the agent's file_access.deny covers it.)")
      // the host sandbox hides the folder from the run itself: send_file there cannot even name it
      if (level === 'unrestricted')
        expect(body.reply).toContain("(File not sent: api.key: the agent's file_access.deny covers it.)")
      const runs = JSON.parse((await runCli(['runs', '--json', '-n', '1'], {home: served.home.home})).stdout)
      expect(runs[0]).toMatchObject({id: body.run_id, isolation: level, status: 'ok'})
    })
  }

  describeWithDocker('containers', () => {
    it('container, then a standby container', async () => {
      const served = await serveAgent({container_mode: {enabled: true, network: 'none', timeout_seconds: 120}})
      await expectOnlyTheReport(served, 'container')
      // the second message is served by the container the first one left waiting
      await expectOnlyTheReport(served, 'container')
      expect(served.serve.output()).toMatch(/standby container/)
    })
  })
})
