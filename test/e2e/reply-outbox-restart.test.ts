import fs from 'node:fs'
import path from 'node:path'
import {describe, expect, it} from 'vitest'
import type {FakeLlm} from '../fakes/llm-server.js'
import {startFakeMeepaChat} from '../fakes/meepachat-server.js'
import {fakeLlmForTests} from '../helpers/fake-llm-for-tests.js'
import {freePort} from '../helpers/free-port.js'
import {fakeLlmConfig, makeHome, runCli, type TestHome} from '../helpers/home.js'
import {serveProcessesKilledAfterEach, startServeProcess} from '../helpers/serve-process.js'
import {waitFor} from '../helpers/wait-for.js'

let llm: FakeLlm
fakeLlmForTests((started) => (llm = started))
const serves = serveProcessesKilledAfterEach()

const words = (text: string) => text.split(/\s+/).filter((word) => word && !word.startsWith('```'))

describe('the reply outbox across a crash (the real CLI)', {timeout: 120_000}, () => {
  it('delivers the rest of a reply a SIGKILLed serve left in the outbox, once, in order', async () => {
    const rows = Array.from({length: 60}, (_, i) => `line ${i}: ${'z'.repeat(70)}`).join('\n')
    const answer = `First part.\n\n\`\`\`text\n${rows}\n\`\`\`\n\n${'Closing words. '.repeat(200).trim()}`
    llm.setDefault({text: answer})
    const {chat, home} = await homeOnMeepaChat()
    try {
      const first = await connectedServe(home)
      // the platform takes the first chunk, then fails every post
      chat.faults.failPosts({status: 503, afterTaken: 1})
      chat.userSays({channelId: 'general', content: 'write me something long'})
      await waitFor('a failed second chunk', () => /not delivered yet/.test(first.output()), 30_000)
      expect(chat.posts).toHaveLength(1)
      first.process.kill('SIGKILL')
      await first.process.catch(() => {})

      const pending = JSON.parse((await runCli(['runs', '--json'], {home: home.home})).stdout)
      expect(pending[0]).toMatchObject({status: 'ok', delivery: 'pending'})

      chat.faults.failPosts(undefined) // the platform is back
      const second = await serveThatDelivers(home)
      expect(second.output()).toMatch(/delivering 1 reply\(ies\) a previous gateway left in the outbox/)
      const chunks = chat.posts.map((post) => post.content)
      expect(chunks.length).toBeGreaterThanOrEqual(3)
      expect(chunks[0]?.startsWith('First part.')).toBe(true)
      expect(words(chunks.join('\n'))).toEqual(words(answer))
      for (const chunk of chunks) expect(chunk.split('\n').filter((line) => line.startsWith('```')).length % 2).toBe(0)
      const runs = JSON.parse((await runCli(['runs', '--json'], {home: home.home})).stdout)
      expect(runs).toHaveLength(1)
      expect(runs[0]).toMatchObject({status: 'ok', delivery: 'delivered', delivery_error: null})
      const table = (await runCli(['runs'], {home: home.home})).stdout.split('\n')
      expect(table[0]).toMatch(/STATUS\s+REPLY\s+DURATION/)
      expect(table[1]).toMatch(/\sok\s+delivered\s/)
    } finally {
      await chat.close()
      home.cleanup()
    }
  })

  it('delivers a file after the platform was down across a stop and a start: the bytes the run produced, once', async () => {
    // not text: the bytes must come back exactly
    const report = Buffer.from(Array.from({length: 3000}, (_, i) => (i * 7) % 256))
    const secret = 'HOST-SECRET-do-not-send'
    const {chat, home} = await homeOnMeepaChat()
    const secretFile = path.join(home.home, 'host-secret.txt')
    fs.writeFileSync(secretFile, secret)
    try {
      const first = await connectedServe(home)
      llm.reset()
      llm.enqueue(
        {
          toolCalls: [
            {name: 'shell', arguments: {command: `mkdir -p out && printf '${octal(report)}' > out/report.bin`}},
            {name: 'send_file', arguments: {path: 'out/report.bin'}},
          ],
        },
        // the platform goes away while the agent writes its answer, and stays away
        async () => {
          await chat.goOffline()
          return {text: 'Here is the report.'}
        },
      )
      chat.userSays({channelId: 'general', content: 'send me the report'})
      await waitFor(
        'a failed file part',
        () => /not delivered yet: cannot reach MeepaChat/.test(first.output()),
        30_000,
      )
      first.process.kill('SIGTERM')
      await first.process
      const spool = path.join(home.home, 'spool', 'outbox')
      expect(fs.readdirSync(spool)).toHaveLength(1)
      // what a previous gateway's crash left between writing a copy and recording it
      fs.writeFileSync(path.join(spool, 'ab'.repeat(16)), 'orphan')
      // the agent's file, after its run, becomes a link to a host secret
      const sent = path.join(home.workspace('a1'), 'out', 'report.bin')
      expect(fs.readFileSync(sent)).toEqual(report)
      fs.rmSync(sent)
      fs.symlinkSync(secretFile, sent)
      const pending = JSON.parse((await runCli(['runs', '--json'], {home: home.home})).stdout)
      expect(pending[0]).toMatchObject({status: 'ok', delivery: 'pending'})

      await chat.comeBack()
      const second = await serveThatDelivers(home)
      expect(second.output()).toMatch(/removed 1 spooled file\(s\) no reply owes any more/)
      expect(chat.posts.map((post) => post.content)).toEqual(['report.bin', 'Here is the report.'])
      expect(chat.posts[0]?.attachments?.map((upload) => [upload.filename, upload.data])).toEqual([
        ['report.bin', report],
      ])
      for (const upload of chat.uploads) expect(upload.data?.toString()).not.toContain(secret)
      expect(fs.readdirSync(spool)).toEqual([])
      const runs = JSON.parse((await runCli(['runs', '--json'], {home: home.home})).stdout)
      expect(runs[0]).toMatchObject({status: 'ok', delivery: 'delivered', delivery_error: null})
      expect(runs[0].files).toEqual([
        {
          direction: 'out',
          name: 'report.bin',
          size: report.length,
          content_type: 'application/octet-stream',
          skipped_reason: null,
        },
      ])
    } finally {
      await chat.close()
      home.cleanup()
    }
  })
})

/** A fake MeepaChat and a home whose agent a1 answers there (with the dashboard, as an operator runs it). */
async function homeOnMeepaChat() {
  const chat = await startFakeMeepaChat({token: '1.secret'})
  const port = await freePort()
  const home = makeHome(
    fakeLlmConfig(
      llm.openaiBaseUrl,
      [{id: 'a1', connectors: [{type: 'meepachat', url: chat.gatewayUrl, bot_token: '1.secret'}]}],
      {captain: {enabled: true, bind: '127.0.0.1', port}},
    ),
  )
  return {chat, home}
}

async function connectedServe(home: TestHome) {
  const serve = await startServeProcess({home: home.home, configPath: home.configPath})
  serves.push(serve.process)
  await waitFor('serve to connect', () => /a1\/meepachat: connected/.test(serve.output()), 15_000)
  return serve
}

/** serve started again, once it delivered the reply the previous one left. */
async function serveThatDelivers(home: TestHome) {
  const serve = await startServeProcess({home: home.home, configPath: home.configPath})
  serves.push(serve.process)
  await waitFor('the reply to be delivered', () => /reply delivered via a1\/meepachat/.test(serve.output()), 30_000)
  return serve
}

/** The bytes as printf escapes: a shell writes them exactly. */
function octal(bytes: Buffer): string {
  return [...bytes].map((byte) => `\\${byte.toString(8).padStart(3, '0')}`).join('')
}
