import fs from 'node:fs'
import os from 'node:os'
import path from 'node:path'
import {expect, it} from 'vitest'
import {DockerCli} from '../../../../src/sandbox/docker/cli.js'
import {giveUpRemovals, scheduleRemoval} from '../../../../src/runtime/runners/container/removals.js'
import {startUnrulyEngine} from '../../../fakes/unruly-engine.js'

/*
 * A gateway owes removals of many containers at once when an engine stops answering (each of its
 * runs and standbys): each waits in a docker client under the one shared cancel. Dozens at once
 * are expected there, and must not print Node's listener-leak warning to the operator.
 */
it('owes a dozen removals to an engine that does not answer without a leak warning, and gives them all up', async () => {
  const engine = await startUnrulyEngine('hang')
  const configDir = fs.mkdtempSync(path.join(os.tmpdir(), 'meepa-removals-'))
  const warnings: Error[] = []
  const onWarning = (warning: Error) => warnings.push(warning)
  process.on('warning', onWarning)
  try {
    const cli = new DockerCli({engineArgs: ['--host', engine.host], configDir})
    const removals = Array.from({length: 12}, (_, i) => scheduleRemoval(cli, `meepa-owed-${i}`, () => {}))
    // every docker client is waiting on the engine
    for (const until = Date.now() + 20_000; engine.requests < 12 && Date.now() < until;)
      await new Promise((resolve) => setTimeout(resolve, 50))
    expect(engine.requests).toBeGreaterThanOrEqual(12)
    giveUpRemovals()
    await Promise.all(removals)
    await new Promise((resolve) => setImmediate(resolve)) // a warning is emitted on the next tick
  } finally {
    process.off('warning', onWarning)
    await engine.close()
    fs.rmSync(configDir, {recursive: true, force: true})
  }
  expect(warnings.map((warning) => warning.name)).not.toContain('MaxListenersExceededWarning')
}, 60_000)
