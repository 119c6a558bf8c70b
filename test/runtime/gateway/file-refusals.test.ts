import fs from 'node:fs'
import os from 'node:os'
import path from 'node:path'
import {afterEach, describe, expect, it} from 'vitest'
import type {Delivery} from '../../../src/runtime/connectors/types.js'
import {Dispatcher} from '../../../src/runtime/gateway/dispatcher.js'
import {RunQueue} from '../../../src/runtime/gateway/run-queue.js'
import type {InboundMessage} from '../../../src/runtime/shapes/agent-run-contract.js'
import {openGatewayDb, type GatewayDb} from '../../../src/runtime/state/gateway-db.js'
import {RunRecords} from '../../../src/runtime/state/run-records.js'
import {readFilesToSend} from '../../../src/runtime/workspace/files-to-send.js'
import {successfulOutput} from '../../helpers/agent-run-output.js'

const CAPS = {max_file_size: '1m', max_files: 10, max_total_size: '2m', inbox_retention_days: 7}

describe('a file the agent names that the gateway cannot open', () => {
  let db: GatewayDb | undefined
  let home: string | undefined
  afterEach(() => {
    db?.close()
    if (home) fs.rmSync(home, {recursive: true, force: true})
  })

  it('is refused with its error code: no newline in the reason or the log line, no host path in the reply', async () => {
    home = fs.mkdtempSync(path.join(os.tmpdir(), 'meepa-refusals-'))
    const workspace = path.join(home, 'ws')
    fs.mkdirSync(workspace)
    db = openGatewayDb(home)
    // one component past NAME_MAX (255 bytes), with a line break that would forge a log line
    const chosen = `${'a'.repeat(150)}\nrun x: forged line ${'b'.repeat(150)}`
    const logged: string[] = []
    const sent: string[] = []
    const delivery: Delivery = {send: async (text) => void sent.push(text), startTyping: () => () => {}}
    const dispatcher = new Dispatcher({
      queue: new RunQueue({maxConcurrent: 1, queueLimit: 5}),
      records: new RunRecords(db),
      run: async (request) => ({
        runId: request.runId,
        level: request.isolation,
        ms: 1,
        output: {...successfulOutput(request.runId, 'Here it is.'), files: [{path: chosen}]},
      }),
      isolationFor: () => 'unrestricted',
      newRunId: () => 'run_1',
      log: (line) => logged.push(line),
      readFiles: (_agentId, requested) => readFilesToSend(workspace, requested, CAPS),
    })
    const message = {connector: 'webchat', channel_id: 'c', id: 'm1', user: {id: 'u'}, content: 'hi'}
    await dispatcher.dispatch('a', message as InboundMessage, delivery).done

    const shown = chosen.replace('\n', '').slice(0, 200)
    expect(sent).toEqual([`Here it is.\n\n(File not sent: ${shown}: it cannot be opened (ENAMETOOLONG).)`])
    expect(sent[0]).not.toContain(home)
    const refusal = logged.filter((line) => line.includes('not sent'))
    expect(refusal).toHaveLength(1)
    expect(refusal[0]).not.toContain('\n')
    expect(refusal[0]).toMatch(
      /^run run_1: file "a+run x: forged line b+" not sent: "it cannot be opened \(ENAMETOOLONG\)" \("ENAMETOOLONG: .*a\\nrun x: forged line b+.*"\)$/,
    )
  })
})
