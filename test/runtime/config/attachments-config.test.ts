import {afterEach, describe, expect, it} from 'vitest'
import {attachmentCaps} from '../../../src/runtime/config/attachment-caps.js'
import {loadConfig} from '../../../src/runtime/config/load.js'
import {fakeLlmConfig, makeHome, type TestHome} from '../../helpers/home.js'

let home: TestHome | undefined
afterEach(() => home?.cleanup())

function load(agents: Array<Record<string, unknown>>, extra: Record<string, unknown> = {}) {
  home = makeHome(fakeLlmConfig('http://127.0.0.1:9/v1', agents, extra))
  return loadConfig({configPath: home.configPath, home: home.home, env: {}})
}

describe('the attachments section', () => {
  it('defaults to 25m, 10 files, 50m, 7 days in the inbox, and merges agent_defaults and the agent field by field', () => {
    const loaded = load([{id: 'plain'}, {id: 'small', attachments: {max_files: 2, inbox_retention_days: 0.5}}], {
      agent_defaults: {attachments: {max_file_size: '5m'}},
    })
    const [plain, small] = loaded.config.agents
    expect(plain?.attachments).toEqual({
      max_file_size: '5m',
      max_files: 10,
      max_total_size: '50m',
      inbox_retention_days: 7,
    })
    expect(small?.attachments).toEqual({
      max_file_size: '5m',
      max_files: 2,
      max_total_size: '50m',
      inbox_retention_days: 0.5,
    })
    expect(attachmentCaps(small!.attachments)).toEqual({fileBytes: 5 * 1024 ** 2, files: 2, totalBytes: 50 * 1024 ** 2})
  })

  it('refuses an inbox kept for no time at all: retention is bounded, never off', () => {
    expect(() => load([{id: 'a', attachments: {inbox_retention_days: 0}}])).toThrow(
      /agents\[0\]\.attachments\.inbox_retention_days: must be > 0/,
    )
  })

  it('refuses a size not in the 512m form and an unknown key, naming the field', () => {
    expect(() => load([{id: 'a', attachments: {max_file_size: '25MB', max_pages: 3}}])).toThrow(
      /agents\[0\]\.attachments: unknown field "max_pages"[\s\S]*agents\[0\]\.attachments\.max_file_size: must match/,
    )
  })
})
