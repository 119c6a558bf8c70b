import fs from 'node:fs'
import path from 'node:path'
import {afterAll, beforeAll, describe, expect, it} from 'vitest'
import {startFakeLlm, type FakeLlm} from '../fakes/llm-server.js'
import {lastUserText, TINY_PNG} from '../helpers/attachments.js'
import {describeWithDocker} from '../helpers/docker-env.js'
import {freePort} from '../helpers/free-port.js'
import {fakeLlmConfig, makeHome, runCli, type TestHome} from '../helpers/home.js'
import {landlockUnavailable} from '../helpers/landlock-support.js'
import {startServe, type ServeProcess} from '../helpers/serve.js'

/*
 * A file through `meepagateway serve` (bin/run.js over dist/) and the web chat, at every isolation
 * level: the gateway downloads it into inbox/<message id>/, the agent reads and removes it from
 * inside its isolation (a container with no network included, and a standby container), its
 * image reaches the model, and `runs` shows the file, never its content.
 */

let llm: FakeLlm
let home: TestHome
let serve: (ServeProcess & {apiKey: string}) | undefined
let base = ''

const AGENTS = [
  {id: 'sandboxed', file_access: {allow_network: false}},
  {id: 'open', file_access: {unrestricted: true}},
  {id: 'boxed', container_mode: {enabled: true, network: 'none', timeout_seconds: 120}},
]

beforeAll(async () => {
  llm = await startFakeLlm()
  const port = await freePort()
  base = `http://127.0.0.1:${port}`
  home = makeHome(fakeLlmConfig(llm.openaiBaseUrl, AGENTS, {captain: {enabled: true, bind: '127.0.0.1', port}}))
})

afterAll(async () => {
  await serve?.stop()
  await llm.close()
  home.cleanup()
})

async function serving(): Promise<ServeProcess & {apiKey: string}> {
  serve ??= await startServe({home: home.home, port: Number(new URL(base).port)})
  return serve
}

/** One message with a text file and an image; the agent cats and removes the file, then answers with what it saw. */
async function sendFiles(agent: string, notes: string) {
  const gateway = await serving()
  let sawImage = false
  let told = ''
  llm.reset()
  llm.enqueue(
    (request) => {
      const user = [...request.body.messages].reverse().find((message: any) => message.role === 'user')
      sawImage = JSON.stringify(user.content).includes(`data:image/png;base64,${TINY_PNG.toString('base64')}`)
      told = lastUserText(request)
      const file = /inbox\/\S+\/notes\.txt/.exec(told)?.[0]
      return {toolCalls: [{name: 'shell', arguments: {command: `cat ${file} && rm ${file} && echo removed`}}]}
    },
    (request) => ({text: `tool said: ${request.body.messages.at(-1).content}`}),
  )
  const response = await fetch(`${base}/api/chat`, {
    method: 'POST',
    headers: {authorization: `Bearer ${gateway.apiKey}`, 'content-type': 'application/json'},
    body: JSON.stringify({
      agent,
      message: 'read my notes',
      attachments: [
        {name: 'notes.txt', content_base64: Buffer.from(notes).toString('base64')},
        {name: 'dot.png', content_base64: TINY_PNG.toString('base64'), content_type: 'image/png'},
      ],
    }),
  })
  const body = (await response.json()) as {reply: string; attachments: Array<{path: string}>}
  return {status: response.status, body, sawImage, told}
}

async function expectDelivered(agent: string, notes: string) {
  const {status, body, sawImage, told} = await sendFiles(agent, notes)
  expect(told).toMatch(/dot\.png \(image\/png, 70 bytes\): an image, shown to you/)
  expect([status, body.reply]).toEqual([200, expect.stringContaining(notes)])
  expect(body.reply).toContain('removed') // the agent owns what arrived: it could delete it
  expect(sawImage).toBe(true)
  const workspace = home.workspace(agent)
  expect(fs.existsSync(path.join(workspace, body.attachments[0]!.path))).toBe(false)
  expect(fs.readFileSync(path.join(workspace, body.attachments[1]!.path))).toEqual(TINY_PNG)
  return body
}

describe('files in through serve and the web chat, at every isolation level', {timeout: 300_000}, () => {
  it('unrestricted: the file arrives, the image reaches the model, and runs lists both', async () => {
    await expectDelivered('open', 'notes for the open agent')
    const runs = await runCli(['runs', '--agent', 'open', '--json'], {home: home.home})
    const [run] = JSON.parse(runs.stdout)
    expect(run.files).toEqual([
      {direction: 'in', name: 'notes.txt', size: 24, content_type: 'application/octet-stream', skipped_reason: null},
      {direction: 'in', name: 'dot.png', size: 70, content_type: 'image/png', skipped_reason: null},
    ])
    const human = await runCli(['runs', '--agent', 'open'], {home: home.home})
    expect(human.stdout).toContain('2 in')
    expect(human.stdout).toContain('in "notes.txt" 24 B application/octet-stream')
    expect(human.stdout).not.toContain('notes for the open agent')
  })

  it.skipIf(landlockUnavailable() !== undefined)(
    'host sandbox without network: the gateway downloaded it, the agent reads it',
    async () => {
      await expectDelivered('sandboxed', 'notes for the sandboxed agent')
    },
  )

  describeWithDocker('container', () => {
    it('a container without network, then a standby container, get their files and own them', async () => {
      await expectDelivered('boxed', 'first notes in a box')
      await expectDelivered('boxed', 'second notes in a box')
      expect(serve!.output()).toMatch(/standby container/)
    }, 600_000)
  })
})
