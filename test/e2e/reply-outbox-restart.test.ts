import {describe, expect, it} from 'vitest'
import type {FakeLlm} from '../fakes/llm-server.js'
import {startFakeMeepaChat} from '../fakes/meepachat-server.js'
import {fakeLlmForTests} from '../helpers/fake-llm-for-tests.js'
import {freePort} from '../helpers/free-port.js'
import {fakeLlmConfig, makeHome, runCli} from '../helpers/home.js'
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
    const chat = await startFakeMeepaChat({token: '1.secret'})
    const port = await freePort()
    const home = makeHome(
      fakeLlmConfig(
        llm.openaiBaseUrl,
        [{id: 'a1', connectors: [{type: 'meepachat', url: chat.gatewayUrl, bot_token: '1.secret'}]}],
        {
          captain: {enabled: true, bind: '127.0.0.1', port},
        },
      ),
    )
    try {
      const first = await startServeProcess({home: home.home, configPath: home.configPath})
      serves.push(first.process)
      await waitFor('the first serve to connect', () => /a1\/meepachat: connected/.test(first.output()), 15_000)
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
      const second = await startServeProcess({home: home.home, configPath: home.configPath})
      serves.push(second.process)
      await waitFor(
        'the reply to be delivered',
        () => /reply delivered via a1\/meepachat/.test(second.output()),
        30_000,
      )
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
})
