import fs from 'node:fs'
import path from 'node:path'
import {describe, expect, it} from 'vitest'
import type {FakeLlm} from '../../fakes/llm-server.js'
import {startFakeDiscord, type FakeDiscord} from '../../fakes/discord-server.js'
import {fakeLlmForTests} from '../../helpers/fake-llm-for-tests.js'
import {TINY_PNG} from '../../helpers/attachments.js'
import {closeAfterEachTest, startTestGateway} from '../gateway/helpers.js'

const TOKEN = 'MTIz.discord.token'
let llm: FakeLlm
fakeLlmForTests((started) => (llm = started), {resetBeforeEach: true})
const closeAfterTest = closeAfterEachTest()

async function gatewayWith() {
  const discord: FakeDiscord = closeAfterTest(await startFakeDiscord({token: TOKEN}))
  const test = closeAfterTest(
    await startTestGateway({
      agents: [
        {id: 'disco', connectors: [{type: 'discord', bot_token: TOKEN, guild_ids: [], api_url: discord.apiUrl}]},
      ],
      llmBaseUrl: llm.openaiBaseUrl,
    }),
  )
  await test.waitForLog(/disco\/discord: connected/)
  return {discord, test, workspace: path.join(test.home.home, 'agents', 'disco')}
}

const attachment = (discord: FakeDiscord, id: string, filename: string, size: number, contentType: string) => ({
  id,
  filename,
  size,
  content_type: contentType,
  url: discord.cdnUrl(`/attachments/1/${id}/${filename}?ex=1&is=2&hm=3`),
  proxy_url: discord.cdnUrl(`/attachments/1/${id}/${filename}`),
})

describe('Discord attachments in (real discord.js against the fake Discord)', () => {
  it('takes every attachment from the CDN without the bot token; the image reaches the model as image_url', async () => {
    llm.setDefault({text: 'a red dot'})
    const {discord, workspace} = await gatewayWith()
    discord.files.add('/attachments/1/a1/dot.png', {body: TINY_PNG, contentType: 'image/png'})
    discord.files.add('/attachments/1/a2/notes.md', {body: Buffer.from('# notes')})
    const id = discord.userSays({
      channelId: '1001',
      content: '',
      attachments: [
        attachment(discord, 'a1', 'dot.png', TINY_PNG.length, 'image/png'),
        attachment(discord, 'a2', 'notes.md', 7, 'text/markdown'),
      ],
    })
    const [reply] = await discord.waitForPosts(1)
    expect(reply?.content).toBe('a red dot')
    expect(discord.files.downloads).toEqual([{path: '/attachments/1/a1/dot.png'}, {path: '/attachments/1/a2/notes.md'}])
    expect(fs.readFileSync(path.join(workspace, 'inbox', id, 'dot.png'))).toEqual(TINY_PNG)
    const user = llm.requests[0]!.body.messages.find((message: any) => message.role === 'user')
    expect(user.content).toEqual([
      {
        type: 'text',
        text: expect.stringContaining(`inbox/${id}/dot.png (image/png, 70 bytes): an image, shown to you`),
      },
      {type: 'image_url', image_url: {url: `data:image/png;base64,${TINY_PNG.toString('base64')}`}},
    ])
    expect(user.content[0].text).toContain(`inbox/${id}/notes.md (text/markdown, 7 bytes)`)
  })

  it('refuses an attachment URL off the CDN and says so', async () => {
    llm.setDefault({text: 'ok'})
    const {discord} = await gatewayWith()
    discord.userSays({
      channelId: '1001',
      content: 'here',
      attachments: [{...attachment(discord, 'a3', 'x.txt', 1, 'text/plain'), url: 'http://169.254.169.254/latest'}],
    })
    const [reply] = await discord.waitForPosts(1)
    expect(reply?.content).toContain(
      "x.txt was not received: the gateway refused to download it: http://169.254.169.254 is not the platform's file server",
    )
  })
})
