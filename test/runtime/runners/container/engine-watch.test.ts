import {afterEach, describe, expect, it, vi} from 'vitest'
import {engineStates} from '../../../../src/runtime/runners/container/engine-health.js'
import {stopWatchingEngines, watchEngines} from '../../../../src/runtime/runners/container/engines.js'
import type {GatewayConfig} from '../../../../src/runtime/config/types.js'

/*
 * The engine watch when an engine's ping never settles (a transport without a deadline, an ssh
 * that never returns): the engine must be marked down, not left up forever by the one ping that
 * is still in flight.
 */

const pings = vi.hoisted(() => ({count: 0}))
vi.mock('../../../../src/runtime/container/podman-api.js', () => ({
  pingPodman: () => {
    pings.count++
    return new Promise(() => {})
  },
}))

describe('the engine watch', () => {
  afterEach(() => {
    stopWatchingEngines()
    vi.useRealTimers()
  })

  it('marks an engine whose ping never settles down after its deadline and a margin, and keeps asking', async () => {
    vi.useFakeTimers()
    const engine = {name: 'stuck', host: 'unix:///nonexistent/podman.sock', kind: 'podman', max_runs: 1}
    watchEngines({engines: [{insecure: false, best_effort: false, ...engine}]} as unknown as GatewayConfig)
    await vi.advanceTimersByTimeAsync(5_000)
    expect(engineStates().get('stuck')?.down).toBeUndefined()
    expect(pings.count).toBe(1) // still waiting on the first
    await vi.advanceTimersByTimeAsync(2_000)
    expect(engineStates().get('stuck')?.down?.reason).toMatch(/no answer to its ping within 6 s/)
    // given up, so the next tick asks again
    expect(pings.count).toBe(2)
  })
})
