import {describe, expect, it} from 'vitest'
import type {FakeLlm} from '../../fakes/llm-server.js'
import {fakeLlmForTests} from '../../helpers/fake-llm-for-tests.js'
import {agentRunsIn} from '../../helpers/processes.js'
import {waitFor} from '../../helpers/wait-for.js'
import {closeAfterEachTest, startTestGateway, type TestGateway} from '../gateway/helpers.js'

/*
 * Issue 25, criterion 2: what a running gateway holds ahead of messages has the operator's budget
 * (gateway.max_standbys, gateway.standby_idle_minutes), the least recently used agent loses its
 * standby first, and /healthz says how many there are and what they hold in memory.
 */
let llm: FakeLlm
fakeLlmForTests((started) => (llm = started), {resetBeforeEach: true})
const closeLater = closeAfterEachTest()

interface Standbys {
  count: number
  resident_bytes: number
  max: number
  idle_minutes: number
  by_level: Record<string, {count: number; resident_bytes: number}>
}
const standbys = async (test: TestGateway): Promise<Standbys> =>
  ((await (await fetch(`${test.gateway.url}/healthz`)).json()) as {standbys: Standbys}).standbys
const waiting = (test: TestGateway, agent: string) => agentRunsIn(test.home.workspace(agent)).length

describe('the standby budget', {timeout: 60_000}, () => {
  it('holds at most gateway.max_standbys: the agent used longest ago loses its standby first; /healthz counts them and their memory', async () => {
    const test = closeLater(
      await startTestGateway({
        agents: [{id: 'a1'}, {id: 'a2'}, {id: 'a3'}],
        llmBaseUrl: llm.openaiBaseUrl,
        gateway: {max_standbys: 2},
      }),
    )
    llm.setDefault({text: 'ok'})
    for (const agent of ['a1', 'a2']) {
      expect((await test.chat({agent, message: 'hi'})).status).toBe(200)
      await waitFor(`a standby for ${agent}`, () => waiting(test, agent) === 1)
    }
    expect((await test.chat({agent: 'a3', message: 'hi'})).status).toBe(200)
    await waitFor('a standby for a3', () => waiting(test, 'a3') === 1)
    await waitFor("a1's standby ended", () => waiting(test, 'a1') === 0)
    expect(waiting(test, 'a2')).toBe(1)
    const usage = await standbys(test)
    expect(usage).toMatchObject({count: 2, max: 2, idle_minutes: 10, by_level: {unrestricted: {count: 2}}})
    // an idle agent-run with its keeper: tens of MB each (≈ 50 MB, 39 of them Node's binary pages)
    expect(usage.resident_bytes).toBeGreaterThan(2 * 10 * 1024 * 1024)
    expect(usage.resident_bytes).toBeLessThanOrEqual(2 * 80 * 1024 * 1024)
  })

  it('ends a standby whose message has not come within gateway.standby_idle_minutes', async () => {
    const test = closeLater(
      await startTestGateway({
        agents: [{id: 'a1'}],
        llmBaseUrl: llm.openaiBaseUrl,
        // 9 s: long enough that a loaded machine sees the standby before it expires
        gateway: {standby_idle_minutes: 0.15},
      }),
    )
    llm.setDefault({text: 'ok'})
    expect((await test.chat({agent: 'a1', message: 'hi'})).status).toBe(200)
    await waitFor('a standby', () => waiting(test, 'a1') === 1)
    expect((await standbys(test)).count).toBe(1)
    await waitFor('the idle standby to end', () => waiting(test, 'a1') === 0, 20_000)
    expect((await standbys(test)).count).toBe(0)
  }, 60_000)

  it('max_standbys: 0 starts none', async () => {
    const test = closeLater(
      await startTestGateway({agents: [{id: 'a1'}], llmBaseUrl: llm.openaiBaseUrl, gateway: {max_standbys: 0}}),
    )
    llm.setDefault({text: 'ok'})
    expect((await test.chat({agent: 'a1', message: 'hi'})).status).toBe(200)
    await new Promise((resolve) => setTimeout(resolve, 1000))
    expect(waiting(test, 'a1')).toBe(0)
    expect((await standbys(test)).count).toBe(0)
  })
})
