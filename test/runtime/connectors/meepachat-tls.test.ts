import fs from 'node:fs'
import os from 'node:os'
import path from 'node:path'
import {afterAll, describe, expect, it} from 'vitest'
import {startFakeMeepaChat} from '../../fakes/meepachat-server.js'
import {selfSignedCertificate} from '../../helpers/self-signed.js'
import {waitFor} from '../../helpers/wait-for.js'
import {closeAfterEachTest, startTestGateway, stubRun} from '../gateway/helpers.js'

/*
 * Issue 23, criterion 7: MeepaChat's `tls_verify`. A server with a self-signed certificate is
 * refused by default (the bot token is never sent to it); `tls_verify: false` connects and
 * answers, and serve warns at start.
 */

const TOKEN = '11.meepa-secret'
const closeAfterTest = closeAfterEachTest()
const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'meepa-tls-'))
afterAll(() => fs.rmSync(dir, {recursive: true, force: true}))

async function selfSigned(): Promise<{key: string; cert: string}> {
  const [key, cert] = [path.join(dir, 'key.pem'), path.join(dir, 'cert.pem')]
  await selfSignedCertificate(cert, key)
  return {key: fs.readFileSync(key, 'utf8'), cert: fs.readFileSync(cert, 'utf8')}
}

async function gatewayOverTls(tlsVerify: boolean | undefined) {
  const chat = closeAfterTest(await startFakeMeepaChat({token: TOKEN, tls: await selfSigned()}))
  const test = closeAfterTest(
    await startTestGateway({
      agents: [
        {
          id: 'meepa',
          connectors: [
            {
              type: 'meepachat',
              url: chat.gatewayUrl,
              bot_token: TOKEN,
              ...(tlsVerify === undefined ? {} : {tls_verify: tlsVerify}),
            },
          ],
        },
      ],
      run: stubRun(),
    }),
  )
  return {chat, test}
}

describe.runIf(fs.existsSync('/usr/bin/openssl'))('MeepaChat over TLS and tls_verify', () => {
  it('by default, a server whose certificate does not verify is never connected to', async () => {
    const {chat, test} = await gatewayOverTls(undefined)
    await test.waitForLog(/meepa\/meepachat: reconnecting \(self[- ]signed certificate.*; next attempt in/)
    const health = await test.health()
    expect(health.body.reasons?.[0]).toMatch(/^connector meepa\/meepachat reconnecting: self[- ]signed certificate/)
    expect(chat.readyCount).toBe(0)
    expect(test.logs.some((line) => line.includes('tls_verify'))).toBe(false)
  })

  it('tls_verify: false connects, answers over the REST API too, and serve warns at start', async () => {
    const {chat, test} = await gatewayOverTls(false)
    await chat.waitForReadyCount(1)
    await waitFor('connected', () => test.logs.some((line) => /meepa\/meepachat: connected/.test(line)))
    chat.userSays({channelId: 'general', content: 'over tls'})
    expect((await chat.waitForPosts(1))[0]?.content).toBe('echo: over tls')
    expect(test.logs).toContainEqual(
      expect.stringMatching(
        /^gateway: WARNING: agent meepa: connectors\[0\] \(meepachat wss:\/\/127\.0\.0\.1:\d+\/api\/bot-gateway\): tls_verify is off/,
      ),
    )
  })
})
