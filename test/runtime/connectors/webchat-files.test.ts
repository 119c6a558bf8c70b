import fs from 'node:fs'
import path from 'node:path'
import {describe, expect, it} from 'vitest'
import type {FakeLlm} from '../../fakes/llm-server.js'
import {fakeLlmForTests} from '../../helpers/fake-llm-for-tests.js'
import {pngOfSize, TINY_PNG} from '../../helpers/attachments.js'
import {waitFor} from '../../helpers/wait-for.js'
import {closeAfterEachTest, startTestGateway} from '../gateway/helpers.js'

let llm: FakeLlm
fakeLlmForTests((started) => (llm = started), {resetBeforeEach: true})
const closeAfterTest = closeAfterEachTest()

async function anthropicGateway(attachments?: Record<string, unknown>, gateway?: Record<string, unknown>) {
  const test = closeAfterTest(
    await startTestGateway({
      agents: [{id: 'web', ...(attachments ? {attachments} : {})}],
      ...(gateway ? {gateway} : {}),
      config: {
        providers: {
          primary: 'claude',
          providers: {
            claude: {
              kind: 'anthropic',
              api_key_env: 'FAKE_LLM_KEY',
              model: 'fake-model',
              base_url: llm.anthropicBaseUrl,
            },
          },
        },
      },
    }),
  )
  return {test, workspace: path.join(test.home.home, 'agents', 'web')}
}

const b64 = (bytes: Buffer) => bytes.toString('base64')

describe('web chat attachments (POST /api/chat, real agent, the fake LLM speaking Anthropic)', () => {
  it('saves the files, sends the image as an Anthropic image block, and answers which files arrived', async () => {
    llm.setDefault({text: 'I see a dot'})
    const {test, workspace} = await anthropicGateway()
    const {status, body} = await test.chat({
      agent: 'web',
      message: 'what is this?',
      attachments: [
        {name: 'dot.png', content_base64: b64(TINY_PNG), content_type: 'image/png'},
        {name: 'disguised.txt', content_base64: b64(TINY_PNG)}, // a PNG by its bytes, whatever its name
      ],
    })
    expect(status).toBe(200)
    expect(body.reply).toBe('I see a dot')
    expect(body.attachments).toEqual([
      {
        name: 'dot.png',
        content_type: 'image/png',
        size: 70,
        path: expect.stringMatching(/^inbox\/web-[^/]+\/dot\.png$/),
      },
      {
        name: 'disguised.txt',
        content_type: 'application/octet-stream',
        size: 70,
        path: expect.stringMatching(/\/disguised\.txt$/),
      },
    ])
    expect(fs.readFileSync(path.join(workspace, body.attachments[0].path))).toEqual(TINY_PNG)
    const request = llm.requests[0]!
    expect(request.api).toBe('anthropic')
    const user = request.body.messages.find((message: any) => message.role === 'user')
    expect(user.content.slice(0, 2)).toEqual([
      {type: 'image', source: {type: 'base64', media_type: 'image/png', data: b64(TINY_PNG)}},
      {type: 'image', source: {type: 'base64', media_type: 'image/png', data: b64(TINY_PNG)}},
    ])
    expect(user.content[2].text).toContain('what is this?')
    expect(user.content[2].text).toContain(`${body.attachments[0].path} (image/png, 70 bytes): an image, shown to you`)
    // the history keeps the text, not the image: the next message's request carries no image block
    await test.chat({agent: 'web', message: 'and now?'})
    const next = llm.requests.at(-1)!.body.messages
    expect(JSON.stringify(next)).not.toContain('"type":"image"')
    expect(JSON.stringify(next)).toContain('dot.png')
  })

  it('describes an image over the provider limit as not shown, with the reason, and still saves it', async () => {
    llm.setDefault({text: 'too big to see'})
    const {test, workspace} = await anthropicGateway()
    const big = pngOfSize(4 * 1024 * 1024) // 5.3 MiB in base64: over Anthropic's 5 MB
    const {status, body} = await test.chat({
      agent: 'web',
      message: 'and this?',
      attachments: [{name: 'big.png', content_base64: b64(big)}],
    })
    expect([status, body.error]).toEqual([200, undefined])
    expect(fs.statSync(path.join(workspace, body.attachments[0].path)).size).toBe(big.length)
    const user = llm.requests[0]!.body.messages.find((message: any) => message.role === 'user')
    const text = JSON.stringify(user.content)
    expect(text).not.toContain('"type":"image"')
    expect(text).toContain(
      "big.png (application/octet-stream, 4.0 MB): an image, not shown to you: it is over the 3.8 MB your model's provider takes per image",
    )
  })

  it('runs a files-only message, applies the caps, and refuses a malformed entry with a 400', async () => {
    llm.setDefault({text: 'fine'})
    const {test} = await anthropicGateway({max_file_size: '1k', max_files: 2, max_total_size: '2k'})
    const {status, body} = await test.chat({
      agent: 'web',
      attachments: [
        {name: 'big.bin', content_base64: b64(Buffer.alloc(2000))},
        {name: 'ok.txt', content_base64: b64(Buffer.from('ok'))},
        {name: 'third.txt', content_base64: b64(Buffer.from('3'))},
      ],
    })
    expect(status).toBe(200)
    expect(body.reply).toContain('fine')
    expect(body.reply).toContain(
      'big.bin was not received: it is larger than the limit per file (1 KB, attachments.max_file_size)',
    )
    expect(body.reply).toContain('third.txt was not received: a message may carry 2 file(s) (attachments.max_files)')
    expect(body.attachments.map((entry: any) => Boolean(entry.path))).toEqual([false, true, false])
    for (const attachments of [[{name: 'x', content_base64: 'not base64!'}], [{content_base64: ''}], 'nope'])
      expect((await test.chat({agent: 'web', message: 'x', attachments})).status).toBe(400)
    expect((await test.chat({agent: 'web', message: ''})).status).toBe(400)
  })
  it('holds at most gateway.max_queued_chat_files_size of waiting messages’ files: past it 429 naming the fix, released when the run starts', async () => {
    let letGo!: () => void
    const busy = new Promise<void>((resolve) => (letGo = resolve))
    llm.enqueue(async () => {
      await busy
      return {text: 'that took a while'}
    })
    llm.setDefault({text: 'got it'})
    const {test, workspace} = await anthropicGateway(undefined, {max_queued_chat_files_size: '1k'})
    const file = (name: string, fill: number) => ({name, content_base64: b64(Buffer.alloc(800, fill))})
    // the agent is busy, so the next message waits in its queue, holding its file
    const blocker = test.chat({agent: 'web', message: 'take your time'})
    await waitFor('the first run', () => llm.requests.length === 1)
    const first = test.chat({agent: 'web', message: 'first', attachments: [file('first.bin', 1)]})
    await waitFor('the first file message in the queue', () => test.gateway.queue.waitingFor('web') === 1)

    const refused = await fetch(`${test.gateway.url}/api/chat`, {
      method: 'POST',
      headers: {'content-type': 'application/json', authorization: `Bearer ${test.apiKey}`},
      body: JSON.stringify({agent: 'web', message: 'second', attachments: [file('second.bin', 2)]}),
    })
    expect(refused.status).toBe(429)
    expect(refused.headers.get('retry-after')).toBe('30')
    const {error} = (await refused.json()) as {error: {code: string; message: string}}
    expect(error.code).toBe('E_BUSY')
    expect(error.message).toBe(
      'the gateway already holds 800 bytes of files for web chat messages waiting for their run, and this ' +
        "message's 800 bytes would take it past its limit (1 KB, gateway.max_queued_chat_files_size): send it " +
        "again once those have run (see Retry-After), or with smaller files; the gateway's operator can raise " +
        'gateway.max_queued_chat_files_size',
    )
    expect(test.gateway.queue.waitingFor('web')).toBe(1)

    letGo()
    expect((await blocker).status).toBe(200)
    const ran = await first
    expect([ran.status, ran.body.reply]).toEqual([200, 'got it'])
    expect(fs.readFileSync(path.join(workspace, ran.body.attachments[0].path))).toEqual(Buffer.alloc(800, 1))
    // its run started: what it held is free again
    const third = await test.chat({agent: 'web', message: 'third', attachments: [file('third.bin', 3)]})
    expect(third.status).toBe(200)
    expect(fs.readFileSync(path.join(workspace, third.body.attachments[0].path))).toEqual(Buffer.alloc(800, 3))
    expect(llm.requests).toHaveLength(3)
  })
})
