import fs from 'node:fs'
import path from 'node:path'
import {afterAll, beforeAll, describe, expect, it} from 'vitest'
import {startFakeLlm, type FakeLlm} from '../fakes/llm-server.js'
import {freePort} from '../helpers/free-port.js'
import {fakeLlmConfig, makeHome, type TestHome} from '../helpers/home.js'
import {startServe, type ServeProcess} from '../helpers/serve.js'

/*
 * A home's install-id (what names its objects on engines) that cannot be used: `serve` still
 * starts and answers the agents that need no engine, says which file and why, and never falls
 * back to naming the home's objects after its path alone.
 */

describe('a home whose install-id cannot be used', () => {
  let llm: FakeLlm
  let home: TestHome
  let serve: (ServeProcess & {apiKey: string}) | undefined

  beforeAll(async () => {
    llm = await startFakeLlm()
    llm.setDefault({text: 'pong'})
    const port = await freePort()
    home = makeHome(
      fakeLlmConfig(llm.openaiBaseUrl, [{id: 'plain'}], {
        captain: {enabled: true, bind: '127.0.0.1', port},
      }),
    )
    // what a restore or a hand edit could leave: a folder where the file was
    fs.mkdirSync(path.join(home.home, 'install-id'))
    serve = await startServe({home: home.home, port})
  }, 60_000)

  afterAll(async () => {
    await serve?.stop()
    await llm.close()
    home.cleanup()
  })

  it('starts, names the file and the problem, and answers an agent that needs no engine', async () => {
    await serve!.waitForOutput(/listening on/)
    expect(serve!.output()).toContain(
      `gateway: warning: cannot use ${path.join(home.home, 'install-id')}, this home's id on engines: it is not a regular file; container runs fail until it is fixed`,
    )
    expect((await serve!.chat('plain', 'hello')).reply).toBe('pong')
    // left as it was: nothing replaced it
    expect(fs.statSync(path.join(home.home, 'install-id')).isDirectory()).toBe(true)
  }, 60_000)
})
