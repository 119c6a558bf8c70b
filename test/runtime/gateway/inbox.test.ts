import {describe, expect, it} from 'vitest'
import type {LoadedConfig} from '../../../src/runtime/config/types.js'
import {receiveInbox} from '../../../src/runtime/gateway/inbox.js'

describe('a message’s files when the agent’s workspace cannot be readied', () => {
  it('skips each with its error code for the sender; the config path and the error text go to the log', async () => {
    const home = '/home/op/.meepagateway'
    const loaded = {config: {agents: []}, path: `${home}/config.yaml`, home} as unknown as LoadedConfig
    const logged: string[] = []
    const received = await receiveInbox(
      loaded,
      'gone',
      'm1',
      [{name: '../<!channel>\n.txt', contentType: 'text/html\r\nX: 1', read: async function* () {}}],
      new AbortController().signal,
      (line) => logged.push(line),
    )
    expect(received).toEqual([
      {
        name: '_<!channel>_.txt',
        content_type: 'application/octet-stream',
        size: 0,
        skipped: "it could not be received (E_AGENT_UNKNOWN; the gateway's log has the details)",
      },
    ])
    expect(logged).toEqual([`file "_<!channel>_.txt" not received: "unknown agent \\"gone\\" in ${home}/config.yaml"`])
  })
})
