import {describe, expect, it} from 'vitest'
import {limitGaps, limitsRefused, podmanLimitWarnings} from '../../../src/runtime/container/podman-limits.js'
import type {EngineConfig} from '../../../src/runtime/config/types.js'

/*
 * What each Podman host can apply, decided from the facts its libpod/info gives (the real engine
 * of this machine is asked in test/runtime/runners/container/podman-engine.test.ts); these are the
 * hosts this machine is not: cgroup v2 with some controllers delegated, and rootful.
 */

describe('the limits a Podman engine can apply', () => {
  it('rootless on cgroup v2 without the cpu controller delegated: cpus is refused, naming the controller', () => {
    const gaps = limitGaps({rootless: true, cgroupVersion: 'v2', controllers: ['memory', 'pids']})
    expect(gaps.map((gap) => gap.limit)).toEqual(['cpus'])
    expect(gaps[0]!.field).toBe('container_mode.cpus')
    expect(gaps[0]!.why).toMatch(/the cpu cgroup controller is not delegated .*it has: memory, pids.*Delegate=cpu/)
    const refusal = limitsRefused('pod', gaps)
    expect(refusal.code).toBe('E_CONFIG')
    expect(refusal.message).toMatch(
      /^engine pod \(Podman\) cannot apply cpus, so the run was refused .*container_mode\.cpus \(cpus\)/,
    )
  })

  it('rootless on cgroup v1 cannot apply any; with every controller delegated, or rootful, all are applied', () => {
    expect(limitGaps({rootless: true, cgroupVersion: 'v1', controllers: []}).map((gap) => gap.limit)).toEqual([
      'memory',
      'cpus',
      'pids',
    ])
    expect(limitGaps({rootless: true, cgroupVersion: 'v2', controllers: ['cpu', 'memory', 'pids', 'io']})).toEqual([])
    expect(limitGaps({rootless: false, cgroupVersion: 'v1', controllers: []})).toEqual([])
  })

  it('an engine that cannot be asked is reported, not guessed', async () => {
    const engine: EngineConfig = {
      name: 'gone',
      host: 'unix:///nonexistent/podman.sock',
      kind: 'podman',
      max_runs: 1,
      insecure: false,
      best_effort: false,
    }
    const [warning] = await podmanLimitWarnings([engine, {...engine, name: 'docker', kind: 'docker'}])
    expect(warning).toEqual({
      engine: 'gone',
      warning: expect.stringMatching(/could not ask Podman engine gone which limits/),
    })
    expect(await podmanLimitWarnings([{...engine, kind: 'docker'}])).toEqual([])
  })
})
