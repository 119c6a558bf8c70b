import fs from 'node:fs'
import path from 'node:path'
import {describe, expect, it} from 'vitest'
import type {FakeLlm} from '../../fakes/llm-server.js'
import {startFakeMeepaChat, type FakeMeepaChat} from '../../fakes/meepachat-server.js'
import {meepaChatAttachmentUrl} from '../../../src/runtime/connectors/meepachat.js'
import {RunRecords, runFilesOf} from '../../../src/runtime/state/run-records.js'
import {lastUserText} from '../../helpers/attachments.js'
import {fakeLlmForTests} from '../../helpers/fake-llm-for-tests.js'
import {closeAfterEachTest, startTestGateway} from '../gateway/helpers.js'

const TOKEN = '11.meepa-secret'
let llm: FakeLlm
fakeLlmForTests((started) => (llm = started), {resetBeforeEach: true})
const closeAfterTest = closeAfterEachTest()

async function gatewayWith(
  attachments?: Record<string, unknown>,
  agent: Record<string, unknown> = {},
  beforeStart?: (workspace: string) => void,
) {
  const chat: FakeMeepaChat = closeAfterTest(await startFakeMeepaChat({token: TOKEN}))
  const test = closeAfterTest(
    await startTestGateway({
      agents: [
        {
          id: 'meepa',
          connectors: [{type: 'meepachat', url: chat.gatewayUrl, bot_token: TOKEN}],
          ...(attachments ? {attachments} : {}),
          ...agent,
        },
      ],
      llmBaseUrl: llm.openaiBaseUrl,
      beforeStart: beforeStart && ((home) => beforeStart(path.join(home.home, 'agents', 'meepa'))),
    }),
  )
  await chat.waitForReadyCount(1)
  return {chat, test, workspace: path.join(test.home.home, 'agents', 'meepa')}
}

describe('MeepaChat attachments in (fake MeepaChat server, real agent with the fake LLM)', () => {
  it('downloads every file with the bot token into inbox/<message id>/ and tells the agent', async () => {
    llm.setDefault({text: 'got them'})
    const {chat, test, workspace} = await gatewayWith()
    const log = Buffer.from('line 1\nERROR disk full\n')
    const csv = Buffer.from('a,b\n1,2\n')
    chat.files.add('/uploads/x1/server.log', {body: log, contentType: 'text/plain'})
    chat.files.add('/uploads/x2/data.csv', {body: csv, contentType: 'text/csv'})
    chat.userSays({
      id: 'msg-7',
      channelId: 'general',
      content: "what's wrong here?",
      attachments: [
        {filename: 'server.log', storedPath: 'uploads/x1/server.log', mimeType: 'text/plain', sizeBytes: log.length},
        {filename: '../../.bashrc', storedPath: '/uploads/x2/data.csv', mimeType: 'text/csv', sizeBytes: csv.length},
      ],
    })
    const [reply] = await chat.waitForPosts(1)
    expect(reply?.content).toBe('got them')
    expect(chat.files.downloads).toEqual([
      {path: '/uploads/x1/server.log', authorization: `Bot ${TOKEN}`},
      {path: '/uploads/x2/data.csv', authorization: `Bot ${TOKEN}`},
    ])
    expect(fs.readFileSync(path.join(workspace, 'inbox/msg-7/server.log'))).toEqual(log)
    // separators and leading dots are gone: the name stays inside inbox/<message id>/
    expect(fs.readFileSync(path.join(workspace, 'inbox/msg-7/_.._.bashrc'))).toEqual(csv)
    const text = lastUserText(llm.requests[0] as never)
    expect(text).toContain("what's wrong here?")
    expect(text).toContain('inbox/msg-7/server.log (text/plain, 23 bytes)')
    expect(text).toContain('inbox/msg-7/_.._.bashrc (text/csv, 8 bytes)')
    const [run] = new RunRecords(test.gateway.db).list()
    expect(runFilesOf(test.gateway.db, [run!.id]).get(run!.id)).toEqual([
      {direction: 'in', name: 'server.log', size: 23, content_type: 'text/plain', skipped_reason: null},
      {direction: 'in', name: '_.._.bashrc', size: 8, content_type: 'text/csv', skipped_reason: null},
    ])
  })

  it('runs a message that is only a file', async () => {
    llm.setDefault({text: 'a file, thanks'})
    const {chat} = await gatewayWith()
    chat.files.add('/uploads/only.txt', {body: Buffer.from('hi')})
    chat.userSays({
      channelId: 'general',
      content: '',
      attachments: [{filename: 'only.txt', storedPath: 'uploads/only.txt'}],
    })
    const [reply] = await chat.waitForPosts(1)
    expect(reply?.content).toBe('a file, thanks')
    expect(lastUserText(llm.requests[0] as never)).toMatch(/inbox\/u\d+\/only\.txt/)
  })

  it('skips a file over the cap, a lying Content-Length and a foreign URL, says which and why, and still runs', async () => {
    llm.setDefault({text: 'done'})
    const {chat, workspace} = await gatewayWith({max_file_size: '1k', max_files: 3, max_total_size: '10k'})
    chat.files.add('/uploads/big.bin', {body: Buffer.alloc(2048)})
    chat.files.add('/uploads/endless.bin', {endless: true})
    chat.files.add('/uploads/ok.txt', {body: Buffer.from('fine')})
    chat.userSays({
      id: 'msg-9',
      channelId: 'general',
      content: 'look',
      attachments: [
        {filename: 'big.bin', storedPath: 'uploads/big.bin', sizeBytes: 10}, // the declared size lies too
        {filename: 'endless.bin', storedPath: 'uploads/endless.bin'},
        {filename: 'evil.txt', storedPath: 'http://169.254.169.254/latest/meta-data'},
        {filename: 'ok.txt', storedPath: 'uploads/ok.txt'},
      ],
    })
    const [reply] = await chat.waitForPosts(1)
    expect(reply?.content).toContain('done')
    expect(reply?.content).toContain('big.bin was not received: it is larger than the limit per file (1 KB')
    expect(reply?.content).toContain('endless.bin was not received: it is larger than the limit per file')
    expect(reply?.content).toContain('evil.txt was not received: its storedPath is not a path on the MeepaChat server')
    expect(reply?.content).toContain('ok.txt was not received: a message may carry 3 file(s) (attachments.max_files)')
    expect(fs.readdirSync(path.join(workspace, 'inbox/msg-9'))).toEqual([])
    const text = lastUserText(llm.requests[0] as never)
    expect(text).toContain('big.bin (application/octet-stream, 10 bytes): not received: it is larger than')
    expect(chat.files.downloads.map((download) => download.path)).toEqual(['/uploads/big.bin', '/uploads/endless.bin'])
  })

  it('never fetches a storedPath that reaches the REST API or hides a query, fragment or encoded dot or slash', async () => {
    llm.setDefault({text: 'done'})
    const {chat, workspace} = await gatewayWith()
    // served if asked for: only the connector's check keeps the token's answers out of the inbox
    chat.files.add('/api/users/@me', {body: Buffer.from('{"id":"bot-1","token":"x"}')})
    chat.files.add('/api/x', {body: Buffer.from('api answer')})
    chat.files.add('/uploads/a', {body: Buffer.from('a')})
    chat.files.add('/uploads/ok.txt', {body: Buffer.from('fine')})
    const forbidden = [
      'api/users/@me',
      '/api/x',
      'API/x',
      'uploads/../api/x',
      'uploads/%2e%2e/api/x',
      'uploads/%2E%2E%2Fapi/x',
      'uploads/a?x=1',
      'uploads/a#x',
    ]
    chat.userSays({
      id: 'msg-10',
      channelId: 'general',
      content: 'look',
      attachments: [
        ...forbidden.map((storedPath, index) => ({filename: `f${index}.json`, storedPath})),
        {filename: 'ok.txt', storedPath: 'uploads/ok.txt'},
      ],
    })
    const [reply] = await chat.waitForPosts(1)
    for (const index of forbidden.keys())
      expect(reply?.content).toMatch(new RegExp(`\\(f${index}\\.json was not received: its storedPath `))
    expect(reply?.content).toContain("f0.json was not received: its storedPath names MeepaChat's REST API")
    expect(reply?.content).toContain('f4.json was not received: its storedPath names MeepaChat')
    expect(reply?.content).toContain('f5.json was not received: its storedPath holds a percent-encoded dot or slash')
    expect(reply?.content).toContain('f6.json was not received: its storedPath carries a query or fragment')
    expect(chat.requests.filter((request) => request.method === 'GET')).toEqual([
      {method: 'GET', url: '/uploads/ok.txt'},
    ])
    expect(fs.readdirSync(path.join(workspace, 'inbox/msg-10'))).toEqual(['ok.txt'])
  })

  it('keeps a server under a path prefix to its own files, outside its API', () => {
    const base = 'https://chat.example/meepa'
    expect(meepaChatAttachmentUrl(base, 'uploads/x/a.png')).toEqual({url: 'https://chat.example/meepa/uploads/x/a.png'})
    expect(meepaChatAttachmentUrl(base, '/uploads/a%20b.png')).toEqual({
      url: 'https://chat.example/meepa/uploads/a%20b.png',
    })
    for (const storedPath of ['api/users/@me', 'uploads/../api/x', 'api;x/users', 'api'])
      expect(meepaChatAttachmentUrl(base, storedPath), storedPath).toEqual({
        problem: "its storedPath names MeepaChat's REST API, not a stored file",
      })
    for (const storedPath of ['', '/', '../api/x', '\\\\evil.example/x', 'https://chat.example/x'])
      expect(meepaChatAttachmentUrl(base, storedPath), storedPath).toEqual({
        problem: 'its storedPath is not a path on the MeepaChat server',
      })
    expect(meepaChatAttachmentUrl(base, 'uploads/a?')).toEqual({
      problem: 'its storedPath carries a query or fragment, which no stored file has',
    })
  })

  it('downloads nothing into a workspace already at its limits.disk: the reply names each file, why and the fix', async () => {
    llm.setDefault({text: 'never asked'})
    // under 1m the limit is measured, never a filesystem of its own (even for a root gateway)
    const {chat, test, workspace} = await gatewayWith(undefined, {limits: {disk: '64k'}}, (workspace) => {
      fs.mkdirSync(workspace, {recursive: true})
      fs.writeFileSync(path.join(workspace, 'full.bin'), Buffer.alloc(64 * 1024, 1))
    })
    chat.files.add('/uploads/x1/data.csv', {body: Buffer.alloc(1000, 2), contentType: 'text/csv'})
    chat.files.add('/uploads/x2/more.csv', {body: Buffer.alloc(10, 3), contentType: 'text/csv'})
    chat.userSays({
      id: 'msg-full',
      channelId: 'general',
      content: 'one more file',
      attachments: [
        {filename: 'data.csv', storedPath: 'uploads/x1/data.csv', sizeBytes: 1000},
        {filename: 'more.csv', storedPath: 'uploads/x2/more.csv'},
      ],
    })
    const [reply] = await chat.waitForPosts(1)
    for (const name of ['data.csv', 'more.csv'])
      expect(reply?.content).toMatch(
        new RegExp(
          `\\(${name.replace('.', '\\.')} was not received: there is no room for it under the agent's disk limit ` +
            `\\(limits\\.disk, 64 KB; its workspace already uses at least \\d+(\\.\\d)? KB\\); ` +
            `remove files from the agent's workspace or raise its limits\\.disk, then send the file again\\.\\)`,
        ),
      )
    expect(chat.files.downloads).toEqual([])
    expect(fs.existsSync(path.join(workspace, 'inbox'))).toBe(false)
    expect(llm.requests).toHaveLength(0)
    const [run] = new RunRecords(test.gateway.db).list()
    expect(run?.error_code).toBe('E_DISK')
    expect(runFilesOf(test.gateway.db, [run!.id]).get(run!.id)).toEqual([
      expect.objectContaining({
        direction: 'in',
        name: 'data.csv',
        skipped_reason: expect.stringContaining('limits.disk'),
      }),
      expect.objectContaining({
        direction: 'in',
        name: 'more.csv',
        skipped_reason: expect.stringContaining('limits.disk'),
      }),
    ])
  })
})
