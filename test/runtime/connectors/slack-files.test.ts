import fs from 'node:fs'
import path from 'node:path'
import {describe, expect, it} from 'vitest'
import type {FakeLlm} from '../../fakes/llm-server.js'
import {startFakeSlack, type FakeSlack} from '../../fakes/slack-server.js'
import {lastUserText} from '../../helpers/attachments.js'
import {fakeLlmForTests} from '../../helpers/fake-llm-for-tests.js'
import {closeAfterEachTest, startTestGateway} from '../gateway/helpers.js'

const BOT = 'xoxb-test-bot-token'
const APP = 'xapp-1-test-app-token'
let llm: FakeLlm
fakeLlmForTests((started) => (llm = started), {resetBeforeEach: true})
const closeAfterTest = closeAfterEachTest()

async function gatewayWith(scopes?: string[], announceScopes?: boolean) {
  const slack: FakeSlack = closeAfterTest(await startFakeSlack({botToken: BOT, appToken: APP, scopes, announceScopes}))
  const test = closeAfterTest(
    await startTestGateway({
      agents: [{id: 'slacker', connectors: [{type: 'slack', bot_token: BOT, app_token: APP, api_url: slack.apiUrl}]}],
      llmBaseUrl: llm.openaiBaseUrl,
    }),
  )
  await test.waitForLog(/slacker\/slack: connected/)
  return {slack, test, workspace: path.join(test.home.home, 'agents', 'slacker')}
}

const slackFile = (slack: FakeSlack, id: string, name: string, size: number, mimetype = 'text/plain') => ({
  id,
  name,
  mimetype,
  size,
  mode: 'hosted',
  url_private: slack.fileUrl(`/files-pri/T1-${id}/${name}`),
})

describe('Slack files in (real Slack clients against the fake Slack)', () => {
  it('downloads every file of a file_share from url_private with the bot token, even without text', async () => {
    llm.setDefault({text: 'read both'})
    const {slack, workspace} = await gatewayWith()
    slack.files.add('/files-pri/T1-F1/a.log', {body: Buffer.from('first')})
    slack.files.add('/files-pri/T1-F2/b.log', {body: Buffer.from('second')})
    const ts = slack.userSays({
      channel: 'C1',
      text: '',
      files: [slackFile(slack, 'F1', 'a.log', 5), slackFile(slack, 'F2', 'b.log', 6)],
    })
    const [reply] = await slack.waitForPosts(1)
    expect(reply?.text).toBe('read both')
    expect(slack.files.downloads).toEqual([
      {path: '/files-pri/T1-F1/a.log', authorization: `Bearer ${BOT}`},
      {path: '/files-pri/T1-F2/b.log', authorization: `Bearer ${BOT}`},
    ])
    expect(fs.readFileSync(path.join(workspace, 'inbox', ts, 'a.log'), 'utf8')).toBe('first')
    expect(fs.readFileSync(path.join(workspace, 'inbox', ts, 'b.log'), 'utf8')).toBe('second')
    expect(lastUserText(llm.requests[0] as never)).toContain(`inbox/${ts}/b.log (text/plain, 6 bytes)`)
  })

  it('never sends the bot token to a url_private on another host or port', async () => {
    llm.setDefault({text: 'ok'})
    const {slack} = await gatewayWith()
    const elsewhere = closeAfterTest(await startFakeSlack({botToken: BOT, appToken: APP}))
    elsewhere.files.add('/files-pri/T1-F9/x.txt', {body: Buffer.from('x')})
    slack.userSays({
      channel: 'C1',
      text: 'see file',
      files: [{...slackFile(slack, 'F9', 'x.txt', 1), url_private: elsewhere.fileUrl('/files-pri/T1-F9/x.txt')}],
    })
    const [reply] = await slack.waitForPosts(1)
    expect(reply?.text).toMatch(
      /x\.txt was not received: the gateway refused to download it: http:\/\/127\.0\.0\.1:\d+ is not the platform's file server/,
    )
    expect(elsewhere.files.downloads).toEqual([])
  })

  it('names the missing files:read scope to the user and the operator, and still answers', async () => {
    llm.setDefault({text: 'no file for me'})
    const {slack, test} = await gatewayWith(['chat:write', 'app_mentions:read', 'channels:history'])
    await test.waitForLog(/slacker\/slack: .*lacks the files:read scope/)
    slack.userSays({channel: 'C1', text: 'look', files: [slackFile(slack, 'F3', 'c.txt', 3)]})
    const [reply] = await slack.waitForPosts(1)
    expect(reply?.text).toContain('no file for me')
    expect(reply?.text).toContain('c.txt was not received: the Slack app lacks the files:read scope')
    expect(slack.files.downloads).toEqual([])
    expect(lastUserText(llm.requests[0] as never)).toContain('files:read')
  })

  it('takes Slack’s sign-in page in place of a file for the missing files:read scope, and says so', async () => {
    llm.setDefault({text: 'answered'})
    const {slack, test, workspace} = await gatewayWith(['chat:write', 'channels:history'], false)
    const ts = slack.userSays({channel: 'C1', text: 'look', files: [slackFile(slack, 'F4', 'd.txt', 3)]})
    const [reply] = await slack.waitForPosts(1)
    expect(reply?.text).toContain(
      'd.txt was not received: it could not be downloaded: the Slack app lacks the files:read scope',
    )
    await test.waitForLog(/slacker\/slack: .*sign-in page.*files:read/)
    expect(fs.readdirSync(path.join(workspace, 'inbox', ts))).toEqual([])
  })

  it('posts a file name and the agent’s words as text, never as Slack markup: no <!channel> from the bot', async () => {
    llm.setDefault({text: 'Q&A for <!here>'})
    const {slack} = await gatewayWith()
    // over the 25 MB cap by its declared size: skipped, and its name echoed in the note
    slack.userSays({channel: 'C1', text: 'look', files: [slackFile(slack, 'F5', '<!channel>.bin', 26 * 1024 * 1024)]})
    const [reply] = await slack.waitForPosts(1)
    expect(reply?.text).toMatch(
      /^Q&amp;A for &lt;!here&gt;\n\n\(&lt;!channel&gt;\.bin was not received: it is larger than/,
    )
    expect(reply?.text).not.toMatch(/[<>]/)
    expect(slack.files.downloads).toEqual([])
  })
})
