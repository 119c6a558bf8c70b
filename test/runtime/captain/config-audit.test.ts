import YAML from 'yaml'
import {afterEach, describe, expect, it} from 'vitest'
import {auditFileEdit} from '../../../src/runtime/captain/config-audit.js'
import {parseConfigText} from '../../../src/runtime/config/load.js'
import {AuditLog} from '../../../src/runtime/state/audit.js'
import {openGatewayDb, type GatewayDb} from '../../../src/runtime/state/gateway-db.js'
import {makeHome, type TestHome} from '../../helpers/home.js'

// A hand edit of config.yaml is audited as the dashboard's edits are (test/gateway/config-watch.test.ts
// drives it through serve); here, what each kind of edit puts on the record.

let home: TestHome | undefined
let db: GatewayDb | undefined
afterEach(() => {
  db?.close()
  home?.cleanup()
  home = db = undefined
})

const providers = {primary: 'p', providers: {p: {kind: 'openai', api_key_env: 'KEY', model: 'm'}}}

function audited(before: Record<string, unknown>, after: Record<string, unknown>) {
  home = makeHome()
  db = openGatewayDb(home.home)
  const audit = new AuditLog(db)
  const text = (value: Record<string, unknown>) => YAML.stringify({providers, ...value})
  const loaded = (value: Record<string, unknown>) => ({
    text: text(value),
    config: parseConfigText(text(value), 'config.yaml', {}).config,
  })
  auditFileEdit(audit, loaded(before), loaded(after))
  return audit
    .list()
    .map((entry) => ({level: entry.level, principal: entry.principal, source: entry.source, summary: entry.summary}))
}

describe('auditFileEdit', () => {
  it('names an agent weakened through agent_defaults in that section, at WARNING', () => {
    const entries = audited(
      {agents: [{id: 'a'}, {id: 'b', container_mode: {enabled: true}}]},
      {
        agent_defaults: {file_access: {unrestricted: true}},
        agents: [{id: 'a'}, {id: 'b', container_mode: {enabled: true}}],
      },
    )
    expect(entries).toEqual([
      {
        level: 'warning',
        principal: 'hand edit',
        source: 'file',
        summary: expect.stringMatching(
          /^agent_defaults changed: file_access: null → \{"unrestricted":true\} \(WEAKENS ISOLATION: agent a: isolation host-sandbox → unrestricted\)$/,
        ),
      },
    ])
  })

  it('records an added agent against the built-in default, removed ones, and other sections; never connector tokens', () => {
    const entries = audited(
      {agents: [{id: 'old', connectors: [{type: 'discord', bot_token: 'token-before-0123'}]}]},
      {
        gateway: {queue_limit: 5},
        image_config: {redact_secrets: false},
        agents: [
          {
            id: 'new',
            file_access: {unrestricted: true},
            connectors: [{type: 'discord', bot_token: 'token-after-4567'}],
          },
        ],
      },
    )
    expect(entries.map((entry) => [entry.level, entry.summary.split(' changed')[0]])).toEqual([
      ['info', 'agent old'],
      ['warning', 'agent new'],
      ['info', 'gateway'],
      ['warning', 'image_config'],
    ])
    expect(entries[1]?.summary).toMatch(/isolation host-sandbox → unrestricted/)
    expect(entries[3]?.summary).toMatch(/redact_secrets off/)
    expect(JSON.stringify(entries)).not.toMatch(/token-(before|after)/)
  })

  it('records nothing for an edit of comments or layout', () => {
    expect(audited({agents: [{id: 'a', max_iterations: 3}]}, {agents: [{max_iterations: 3, id: 'a'}]})).toEqual([])
  })
})
