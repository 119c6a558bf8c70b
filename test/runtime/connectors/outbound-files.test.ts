import fs from 'node:fs'
import path from 'node:path'
import {describe, expect, it} from 'vitest'
import type {FakeLlm} from '../../fakes/llm-server.js'
import {startFakeMeepaChat} from '../../fakes/meepachat-server.js'
import {startFakeDiscord} from '../../fakes/discord-server.js'
import {startFakeSlack} from '../../fakes/slack-server.js'
import {RunRecords} from '../../../src/runtime/state/run-records.js'
import {fakeLlmForTests} from '../../helpers/fake-llm-for-tests.js'
import {closeAfterEachTest, startTestGateway} from '../gateway/helpers.js'
import {waitFor} from '../../helpers/wait-for.js'

// Real agent runs (unrestricted) with the fake LLM scripting send_file; the files go out through
// each platform's own upload API, spoken by its wire fake.
let llm: FakeLlm
fakeLlmForTests((started) => (llm = started))
const closeAfterTest = closeAfterEachTest()

const REPORT = 'line one\nline two\n'

/** The agent writes report.txt (and big.bin when asked), sends them, then answers. */
function scriptAgentSendingFiles(extra: Array<{name: string; arguments: Record<string, unknown>}> = []): void {
  llm.enqueue(
    {
      toolCalls: [
        {name: 'write_file', arguments: {path: 'out/report.txt', content: REPORT}},
        {name: 'send_file', arguments: {path: 'out/report.txt'}},
        ...extra,
      ],
    },
    {text: 'Here is the report.'},
  )
}

async function gatewayFor(
  connector: Record<string, unknown>,
  attachments?: Record<string, unknown>,
  gateway?: Record<string, unknown>,
) {
  return closeAfterTest(
    await startTestGateway({
      agents: [{id: 'filer', connectors: [connector], ...(attachments ? {attachments} : {})}],
      llmBaseUrl: llm.openaiBaseUrl,
      ...(gateway ? {gateway} : {}),
    }),
  )
}

/** The agent sends report.txt; the platform goes away while the agent writes its answer. */
function scriptAgentSendingAsPlatformGoes(platform: {goOffline(): Promise<void>}): void {
  llm.enqueue(
    {
      toolCalls: [
        {name: 'write_file', arguments: {path: 'out/report.txt', content: REPORT}},
        {name: 'send_file', arguments: {path: 'out/report.txt'}},
      ],
    },
    async () => {
      await platform.goOffline()
      return {text: 'Here is the report.'}
    },
  )
}

/** The files recorded for the newest run, once written (after the reply went out). */
function outboundRecords(gateway: Awaited<ReturnType<typeof gatewayFor>>) {
  return waitFor('the run files record', () => {
    const files = new RunRecords(gateway.gateway.db).listWithFiles()[0]?.files
    return files && files.length > 0 ? files : undefined
  })
}

describe('files an agent sends go out through each platform (wire fakes)', () => {
  it('MeepaChat: presign, multipart upload, then attachmentIds on a message of its own, then the text; the record lists the file', async () => {
    const chat = closeAfterTest(await startFakeMeepaChat({token: '1.t'}))
    const gateway = await gatewayFor({type: 'meepachat', url: chat.gatewayUrl, bot_token: '1.t'})
    await chat.waitForReadyCount(1)
    scriptAgentSendingFiles()
    chat.userSays({channelId: 'general', content: 'send me the report', threadId: 'p1'})
    const [post, text] = await chat.waitForPosts(2)
    expect(text).toMatchObject({content: 'Here is the report.', threadId: 'p1'})
    expect(text?.attachments).toBeUndefined()
    expect(post).toMatchObject({content: 'report.txt', threadId: 'p1'})
    expect(post?.attachments?.map((upload) => [upload.filename, upload.mimeType, upload.partName])).toEqual([
      ['report.txt', 'text/plain', 'report.txt'],
    ])
    expect(post?.attachments?.[0]?.data?.toString()).toBe(REPORT)
    await gateway.waitForLog(/filer via meepachat ok/)
    expect(await outboundRecords(gateway)).toEqual([
      {direction: 'out', name: 'report.txt', size: REPORT.length, content_type: 'text/plain', skipped_reason: null},
    ])
  })

  it('MeepaChat: an upload the server refuses (413) keeps the reply, with a note naming the file, and is recorded', async () => {
    const chat = closeAfterTest(await startFakeMeepaChat({token: '1.t'}))
    const gateway = await gatewayFor({type: 'meepachat', url: chat.gatewayUrl, bot_token: '1.t'})
    await chat.waitForReadyCount(1)
    chat.limitUploads(10)
    scriptAgentSendingFiles()
    chat.userSays({channelId: 'general', content: 'send me the report'})
    const [post] = await chat.waitForPosts(1)
    expect(post?.attachments).toBeUndefined()
    expect(post?.content).toMatch(/^Here is the report\.\n\n\(File not sent: report\.txt: .*HTTP 413.*too large/)
    await gateway.waitForLog(/file "report.txt" not sent/)
    await waitFor('the refusal in the run record', async () => (await outboundRecords(gateway))?.[0]?.skipped_reason)
    expect((await outboundRecords(gateway))?.[0]).toMatchObject({
      direction: 'out',
      name: 'report.txt',
      size: REPORT.length,
      skipped_reason: expect.stringMatching(/HTTP 413/),
    })
  })

  it('MeepaChat down when the run ends, then back refusing the file (413): the text goes out naming it, once, and the spool empties', async () => {
    const chat = closeAfterTest(await startFakeMeepaChat({token: '1.t'}))
    const gateway = await gatewayFor({type: 'meepachat', url: chat.gatewayUrl, bot_token: '1.t'})
    await chat.waitForReadyCount(1)
    scriptAgentSendingAsPlatformGoes(chat)
    chat.userSays({channelId: 'general', content: 'send me the report'})
    await gateway.waitForLog(/reply via filer\/meepachat .* not delivered yet: cannot reach MeepaChat/)
    const spool = path.join(gateway.home.home, 'spool', 'outbox')
    expect(fs.readdirSync(spool)).toHaveLength(1)
    chat.limitUploads(10)
    await chat.comeBack()
    const [post] = await chat.waitForPosts(1)
    expect(post?.attachments).toBeUndefined()
    expect(post?.content).toMatch(
      /^Here is the report\.\n\n\(File not sent: report\.txt: MeepaChat answered HTTP 413 .*too large\.\)$/,
    )
    await gateway.waitForLog(/reply delivered via filer\/meepachat/)
    expect(chat.posts).toHaveLength(1)
    expect(fs.readdirSync(spool)).toEqual([])
    const [run] = new RunRecords(gateway.gateway.db).listWithFiles()
    expect(run).toMatchObject({delivery: 'delivered', delivery_error: null})
    expect(run?.files).toEqual([
      expect.objectContaining({
        direction: 'out',
        name: 'report.txt',
        skipped_reason: expect.stringMatching(/HTTP 413/),
      }),
    ])
  })

  it('MeepaChat down past reply_delivery_minutes: the reply and its file are given up on, recorded why, and the spool empties', async () => {
    const chat = closeAfterTest(await startFakeMeepaChat({token: '1.t'}))
    const gateway = await gatewayFor({type: 'meepachat', url: chat.gatewayUrl, bot_token: '1.t'}, undefined, {
      reply_delivery_minutes: 0.02, // 1.2 s
    })
    await chat.waitForReadyCount(1)
    scriptAgentSendingAsPlatformGoes(chat)
    chat.userSays({channelId: 'general', content: 'send me the report'})
    await gateway.waitForLog(
      /WARNING run .*: the reply via filer\/meepachat could not be delivered: cannot reach MeepaChat/,
    )
    expect(fs.readdirSync(path.join(gateway.home.home, 'spool', 'outbox'))).toEqual([])
    const [run] = new RunRecords(gateway.gateway.db).listWithFiles()
    expect(run).toMatchObject({
      delivery: 'undeliverable',
      delivery_error: expect.stringMatching(/cannot reach MeepaChat/),
    })
    expect(run?.files).toEqual([
      expect.objectContaining({
        name: 'report.txt',
        skipped_reason: expect.stringMatching(/^not delivered: cannot reach/),
      }),
    ])
  })

  it('MeepaChat failing: a reply whose file does not fit gateway.max_outbox_spool_size goes out with its text naming it; the first reply’s file is delivered', async () => {
    const chat = closeAfterTest(await startFakeMeepaChat({token: '1.t'}))
    const gateway = await gatewayFor({type: 'meepachat', url: chat.gatewayUrl, bot_token: '1.t'}, undefined, {
      max_outbox_spool_size: '1k',
    })
    await chat.waitForReadyCount(1)
    for (const [name, fill] of [
      ['first.txt', '1'],
      ['second.txt', '2'],
    ] as const)
      llm.enqueue(
        {
          toolCalls: [
            {name: 'write_file', arguments: {path: name, content: fill.repeat(700)}},
            {name: 'send_file', arguments: {path: name}},
          ],
        },
        {text: `Here is ${name}.`},
      )
    // the platform takes nothing for now: the first reply's file waits in the spool
    chat.faults.failPosts({status: 503})
    chat.userSays({channelId: 'general', content: 'the first file please'})
    await gateway.waitForLog(/reply via filer\/meepachat .* not delivered yet/)
    chat.userSays({channelId: 'general', content: 'and the second'})
    const full =
      "the gateway's outgoing file spool is full (replies not yet delivered hold 700 bytes of its 1 KB, " +
      'gateway.max_outbox_spool_size, and the file is 700 bytes); ask for it again once they are delivered, ' +
      "or the gateway's operator can raise gateway.max_outbox_spool_size"
    await gateway.waitForLog(/file "second\.txt" not sent: "the gateway's outgoing file spool is full/)
    expect(fs.readdirSync(path.join(gateway.home.home, 'spool', 'outbox'))).toHaveLength(1)

    chat.faults.failPosts(undefined)
    const [file, firstText, secondText] = await chat.waitForPosts(3)
    expect(file?.attachments?.map((upload) => [upload.filename, upload.data?.toString()])).toEqual([
      ['first.txt', '1'.repeat(700)],
    ])
    expect(firstText?.content).toBe('Here is first.txt.')
    expect(secondText?.content).toBe(`Here is second.txt.\n\n(File not sent: second.txt: ${full}.)`)
    expect(chat.uploads.map((upload) => upload.filename)).not.toContain('second.txt')
    await gateway.waitForLog(/reply delivered via filer\/meepachat/)
    const runs = new RunRecords(gateway.gateway.db).listWithFiles()
    expect(runs.flatMap((run) => run.files ?? []).map((row) => [row.name, row.skipped_reason])).toEqual(
      expect.arrayContaining([
        ['first.txt', null],
        ['second.txt', full],
      ]),
    )
  })

  it('files the gateway refuses (a link swapped in after send_file, over the count cap) are named in the reply and recorded', async () => {
    const chat = closeAfterTest(await startFakeMeepaChat({token: '1.t'}))
    const gateway = await gatewayFor(
      {type: 'meepachat', url: chat.gatewayUrl, bot_token: '1.t'},
      {max_files: 2, max_file_size: '1m', max_total_size: '2m'},
    )
    await chat.waitForReadyCount(1)
    scriptAgentSendingFiles([
      {name: 'write_file', arguments: {path: 'swapped.txt', content: 'three'}},
      {name: 'send_file', arguments: {path: 'swapped.txt'}},
      // after the tool's own check: the gateway must not follow what the agent swaps in
      {name: 'shell', arguments: {command: 'rm swapped.txt && ln -s /etc/passwd swapped.txt'}},
      {name: 'write_file', arguments: {path: 'second.txt', content: 'two'}},
      {name: 'send_file', arguments: {path: 'second.txt'}},
      {name: 'write_file', arguments: {path: 'third.txt', content: 'three'}},
      {name: 'send_file', arguments: {path: 'third.txt'}},
    ])
    chat.userSays({channelId: 'general', content: 'files please'})
    const [first, second, post] = await chat.waitForPosts(3)
    expect([first, second].map((file) => file?.attachments?.map((upload) => upload.filename))).toEqual([
      ['report.txt'],
      ['second.txt'],
    ])
    expect(post?.content).toContain('(File not sent: swapped.txt: it is a symbolic link.)')
    expect(post?.content).toContain('(File not sent: third.txt: over the limit of 2 files per message')
    expect(post?.content).not.toContain('root:')
    expect((await outboundRecords(gateway))?.map((file) => [file.name, file.skipped_reason === null])).toEqual([
      ['report.txt', true],
      ['second.txt', true],
      ['swapped.txt', false],
      ['third.txt', false],
    ])
  })

  it('Discord: the file as a message attachment; a 413 keeps the reply with a note', async () => {
    const discord = closeAfterTest(await startFakeDiscord({token: 'MTIz.d.t'}))
    const gateway = await gatewayFor({type: 'discord', bot_token: 'MTIz.d.t', guild_ids: [], api_url: discord.apiUrl})
    await gateway.waitForLog(/filer\/discord: connected/)
    scriptAgentSendingFiles()
    discord.userSays({channelId: '1001', content: 'report?'})
    const posts = await discord.waitForPosts(2)
    expect(posts[0]?.attachments?.map((file) => [file.name, file.data.toString()])).toEqual([['report.txt', REPORT]])
    expect(posts[1]?.content).toBe('Here is the report.')

    discord.limitUploads(10)
    scriptAgentSendingFiles()
    discord.userSays({channelId: '1001', content: 'again'})
    const [, , refusedReply] = await discord.waitForPosts(3)
    expect(refusedReply?.content).toMatch(
      /^Here is the report\.\n\n\(File not sent: report\.txt: Discord refused it: .*too large/i,
    )
    await waitFor('the refusal in the run record', () =>
      new RunRecords(gateway.gateway.db).listWithFiles()[0]?.files?.[0]?.skipped_reason?.match(/too large/i),
    )
  })

  it('Discord: a file rate-limited with a Retry-After is sent after that wait, then the text, in order', async () => {
    const discord = closeAfterTest(await startFakeDiscord({token: 'MTIz.d.t'}))
    const gateway = await gatewayFor({type: 'discord', bot_token: 'MTIz.d.t', guild_ids: [], api_url: discord.apiUrl})
    await gateway.waitForLog(/filer\/discord: connected/)
    discord.faults.failPosts({status: 429, retryAfterSeconds: 1, times: 1})
    scriptAgentSendingFiles()
    discord.userSays({channelId: '1001', content: 'report?'})
    const [file, text] = await discord.waitForPosts(2)
    expect(file?.attachments?.map((sent) => [sent.name, sent.data.toString()])).toEqual([['report.txt', REPORT]])
    expect(text?.content).toBe('Here is the report.')
    const [refused, taken] = discord.faults.attempts
    expect(refused?.status).toBe(429)
    expect(taken!.time - refused!.time).toBeGreaterThanOrEqual(950)
    expect(discord.faults.attempts).toHaveLength(3)
  })

  it('Slack: files.uploadV2 into the thread; a missing files:write scope is named in the reply', async () => {
    const slack = closeAfterTest(await startFakeSlack({botToken: 'xoxb-1', appToken: 'xapp-1'}))
    const gateway = await gatewayFor({type: 'slack', bot_token: 'xoxb-1', app_token: 'xapp-1', api_url: slack.apiUrl})
    await slack.waitForHelloCount(1)
    scriptAgentSendingFiles()
    const ts = slack.userSays({channel: 'C1', text: 'report?'})
    const [reply] = await slack.waitForPosts(1)
    expect(reply).toMatchObject({text: 'Here is the report.', thread_ts: ts})
    expect(slack.shares).toHaveLength(1)
    expect(slack.shares[0]).toMatchObject({channel: 'C1', thread_ts: ts})
    expect(slack.shares[0]?.files.map((file) => [file.name, file.data?.toString()])).toEqual([['report.txt', REPORT]])

    slack.refuseUploadsWith('missing_scope')
    scriptAgentSendingFiles()
    slack.userSays({channel: 'C1', text: 'again'})
    const [, refusedReply] = await slack.waitForPosts(2)
    expect(refusedReply?.text).toMatch(
      /^Here is the report\.\n\n\(File not sent: report\.txt: Slack refused it: the app lacks the files:write scope/,
    )
    expect(slack.shares).toHaveLength(1)
    await gateway.waitForLog(/file "report.txt" not sent: "Slack refused it/)
  })

  it('web chat: the files in the JSON answer, base64', async () => {
    const gateway = closeAfterTest(await startTestGateway({agents: [{id: 'filer'}], llmBaseUrl: llm.openaiBaseUrl}))
    scriptAgentSendingFiles()
    const {status, body} = await gateway.chat({agent: 'filer', message: 'report?'})
    expect(status).toBe(200)
    expect(body.reply).toBe('Here is the report.')
    expect(body.files).toEqual([
      {
        name: 'report.txt',
        size: REPORT.length,
        content_type: 'text/plain',
        content_base64: Buffer.from(REPORT).toString('base64'),
      },
    ])
  })
})
