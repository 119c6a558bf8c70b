import fs from 'node:fs'
import os from 'node:os'
import path from 'node:path'
import {afterEach, describe, expect, it} from 'vitest'
import type {IsolationLevel} from '../../../src/runtime/config/types.js'
import type {Delivery} from '../../../src/runtime/connectors/types.js'
import {Dispatcher, type RunFunction} from '../../../src/runtime/gateway/dispatcher.js'
import {RunQueue} from '../../../src/runtime/gateway/run-queue.js'
import type {InboundMessage} from '../../../src/runtime/shapes/agent-run-contract.js'
import {openGatewayDb, type GatewayDb} from '../../../src/runtime/state/gateway-db.js'
import {RunRecords} from '../../../src/runtime/state/run-records.js'
import {successfulOutput} from '../../helpers/agent-run-output.js'

const message = (id: string): InboundMessage =>
  ({connector: 'webchat', channel_id: 'c', id, user: {id: 'u'}, text: 'hi'}) as unknown as InboundMessage

const delivery: Delivery = {send: async () => {}, startTyping: () => () => {}}

describe('the dispatcher works out a message’s isolation level once', () => {
  let db: GatewayDb | undefined
  let home: string | undefined
  afterEach(() => {
    db?.close()
    if (home) fs.rmSync(home, {recursive: true, force: true})
  })

  it('asks once, when the turn comes, and the run uses the level its record names', async () => {
    home = fs.mkdtempSync(path.join(os.tmpdir(), 'meepa-dispatch-'))
    db = openGatewayDb(home)
    const records = new RunRecords(db)
    let level: IsolationLevel = 'host-sandbox'
    let asked = 0
    const ranWith: IsolationLevel[] = []
    let releaseFirst!: () => void
    const firstHeld = new Promise<void>((resolve) => (releaseFirst = resolve))
    const run: RunFunction = async (request) => {
      ranWith.push(request.isolation)
      if (ranWith.length === 1) await firstHeld
      return {
        runId: request.runId,
        level: request.isolation,
        ms: 1,
        output: successfulOutput(request.runId, 'done'),
      }
    }
    let counter = 0
    const dispatcher = new Dispatcher({
      queue: new RunQueue({maxConcurrent: 1, queueLimit: 5}),
      records,
      run,
      isolationFor: () => {
        asked += 1
        return level
      },
      newRunId: () => `run_${++counter}`,
      log: () => {},
    })
    const first = dispatcher.dispatch('a', message('m1'), delivery)
    const second = dispatcher.dispatch('a', message('m2'), delivery)
    while (ranWith.length === 0) await new Promise((resolve) => setImmediate(resolve))
    // the operator moves the agent to containers while the second message waits
    level = 'container'
    releaseFirst()
    await Promise.all([first.done, second.done])

    expect(ranWith).toEqual(['host-sandbox', 'container'])
    expect(asked).toBe(2)
    expect(records.get(second.runId)?.isolation).toBe('container')
    expect(records.get(first.runId)?.isolation).toBe('host-sandbox')
  })
})
