import {afterAll, beforeAll, expect, it} from 'vitest'
import {startFakeLlm, type FakeLlm} from '../fakes/llm-server.js'
import {fakeLlmConfig, makeHome, runCli} from '../helpers/home.js'
let llm: FakeLlm
beforeAll(async () => { llm = await startFakeLlm() })
afterAll(() => llm.close())
it('tool timeout under sandbox', async () => {
  const home = makeHome(fakeLlmConfig(llm.openaiBaseUrl, [{id: 'meepa', timeout_seconds: 25}]))
  llm.enqueue({toolCalls: [{name: 'shell', arguments: {command: 'sleep 15 & sleep 15; echo after', timeout_seconds: 2}}]}, {text: 'done'})
  const t = Date.now()
  const r = await runCli(['send', '--agent', 'meepa', 'go'], {home: home.home})
  console.log('ms', Date.now() - t, r.exitCode, r.stdout, r.stderr.slice(0, 300))
  console.log(JSON.stringify(llm.requests.at(-1)?.body.messages.at(-1)))
  home.cleanup()
}, 60000)
