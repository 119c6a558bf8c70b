import {describe, expect, it} from 'vitest'
import {DEFAULT_IMAGE_CONFIG} from '../../../src/runtime/config/defaults.js'
import {resolveAgent} from '../../../src/runtime/config/load.js'
import {CONFIG_SCHEMA} from '../../../src/runtime/config/schema.js'
import type {EngineConfig, ImageConfig} from '../../../src/runtime/config/types.js'
import {
  agentWeakenings,
  AGENT_FIELD_AUDIT,
  ENGINE_FIELD_AUDIT,
  engineWeakenings,
  IMAGE_CONFIG_FIELD_AUDIT,
  imageConfigWeakenings,
  NEUTRAL,
} from '../../../src/runtime/captain/weakenings.js'

/** Sections no API route changes (the operator edits them in config.yaml): config edits are not audited there. */
const NOT_EDITED_THROUGH_THE_API = ['captain', 'gateway', 'providers']

interface SchemaNode {
  type?: string
  properties?: Record<string, SchemaNode>
}

/** Leaf fields of a schema object, nested ones dotted (`file_access.allow_listen`). */
function leaves(node: SchemaNode, prefix = ''): string[] {
  if (!node.properties) return [prefix]
  return Object.entries(node.properties).flatMap(([name, child]) => leaves(child, prefix ? `${prefix}.${name}` : name))
}

const schema = CONFIG_SCHEMA as unknown as {properties: Record<string, SchemaNode & {items?: SchemaNode}>}
const ruled = (table: Record<string, unknown>) =>
  Object.keys(table)
    .filter((field) => table[field] !== NEUTRAL)
    .sort()

type Raw = Record<string, unknown>
/** A change that loosens each field the tables rule on: the agent (or image_config) before and after. */
const AGENT_LOOSENINGS: Record<string, {before?: Raw; after: Raw}> = {
  timeout_seconds: {after: {timeout_seconds: 3600}},
  'container_mode.enabled': {before: {container_mode: {enabled: true}}, after: {container_mode: {enabled: false}}},
  'container_mode.image': {after: {container_mode: {image: 'someone/else:latest'}}},
  'container_mode.memory_limit': {after: {container_mode: {memory_limit: '8g'}}},
  'container_mode.timeout_seconds': {after: {container_mode: {timeout_seconds: 3600}}},
  'container_mode.network': {after: {container_mode: {network: 'host'}}},
  'container_mode.pids_limit': {after: {container_mode: {pids_limit: 100_000}}},
  'container_mode.cpus': {after: {container_mode: {cpus: 16}}},
  'container_mode.user': {after: {container_mode: {user: '0'}}},
  'container_mode.engines': {
    before: {container_mode: {engines: ['near']}},
    after: {container_mode: {engines: ['near', 'far']}},
  },
  'file_access.unrestricted': {after: {file_access: {unrestricted: true}}},
  'file_access.allow_read': {after: {file_access: {allow_read: ['/etc']}}},
  'file_access.allow_read_write': {after: {file_access: {allow_read_write: ['/home']}}},
  'file_access.deny': {before: {file_access: {deny: ['/srv/secret']}}, after: {file_access: {deny: []}}},
  'file_access.allow_home_dotfiles': {after: {file_access: {allow_home_dotfiles: true}}},
  'file_access.allow_network': {
    before: {file_access: {allow_network: false}},
    after: {file_access: {allow_network: true}},
  },
  'file_access.allow_listen': {after: {file_access: {allow_listen: true}}},
  'file_access.best_effort': {after: {file_access: {best_effort: true}}},
  'limits.memory': {after: {limits: {memory: '8g'}}},
  'limits.pids': {after: {limits: {pids: 100_000}}},
  'limits.cpus': {after: {limits: {cpus: 16}}},
  'limits.disk': {after: {limits: {disk: '100g'}}},
  'attachments.max_file_size': {after: {attachments: {max_file_size: '1g'}}},
  'attachments.max_files': {after: {attachments: {max_files: 500}}},
  'attachments.max_total_size': {after: {attachments: {max_total_size: '4g'}}},
  secrets: {after: {secrets: ['AWS_SECRET_ACCESS_KEY']}},
  connectors: {
    before: {connectors: [{type: 'meepachat', url: 'wss://chat.example/api/bot-gateway', bot_token: '1.x'}]},
    after: {
      connectors: [{type: 'meepachat', url: 'wss://chat.example/api/bot-gateway', bot_token: '1.x', tls_verify: false}],
    },
  },
}
const IMAGE_LOOSENINGS: Record<string, {before?: Partial<ImageConfig>; after: Partial<ImageConfig>}> = {
  enabled: {after: {enabled: true}},
  image: {after: {image: 'someone/else:latest'}},
  base_image: {after: {base_image: 'ubuntu:24.04'}},
  packages: {after: {packages: ['sudo']}},
  env_vars: {after: {env_vars: {LD_PRELOAD: '/workspace/hook.so'}}},
  inject_credentials_env: {after: {inject_credentials_env: true}},
  inject_secrets_env: {before: {inject_secrets_env: false}, after: {inject_secrets_env: true}},
  redact_secrets: {after: {redact_secrets: false}},
}

const ENGINE_LOOSENINGS: Record<string, {before?: Partial<EngineConfig>; after: Partial<EngineConfig>}> = {
  host: {after: {host: 'tcp://other.example:2376'}},
  context: {after: {context: 'someone-elses'}},
  'tls.ca': {after: {tls: {ca: '/etc/other-ca.pem', cert: '/etc/c.pem', key: '/etc/k.pem'}}},
  'tls.cert': {after: {tls: {ca: '/etc/ca.pem', cert: '/etc/other.pem', key: '/etc/k.pem'}}},
  'tls.key': {after: {tls: {ca: '/etc/ca.pem', cert: '/etc/c.pem', key: '/etc/other-key.pem'}}},
  insecure: {after: {insecure: true}},
  best_effort: {after: {best_effort: true}},
  'ssh.known_hosts': {after: {ssh: {known_hosts: '/etc/someone-elses-known-hosts'}}},
}
const engine = (fields: Partial<EngineConfig> = {}): EngineConfig => ({
  name: 'far',
  host: 'tcp://far.example:2376',
  kind: 'docker',
  max_runs: 8,
  insecure: false,
  best_effort: false,
  tls: {ca: '/etc/ca.pem', cert: '/etc/c.pem', key: '/etc/k.pem'},
  ...fields,
})

/** Fields with no tighter direction: every value is another image. */
const EVERY_CHANGE_WARNS = new Set(['base_image'])

const agent = (raw: Raw = {}) => resolveAgent({id: 'a1', ...raw}, {})
const image = (fields: Partial<ImageConfig> = {}): ImageConfig => ({...DEFAULT_IMAGE_CONFIG, ...fields})
/** What a weakening of `field` reads like: the field named first, or the isolation level it lowers. */
const names = (field: string) => (found: string) =>
  found.startsWith(`${field} `) ||
  (/^(container_mode\.enabled|file_access\.unrestricted)$/.test(field) && found.startsWith('isolation '))

describe('the audit level of every config field', () => {
  it('classifies every field of the schema an API route can change (a new field fails here until it is)', () => {
    const sections = Object.keys(schema.properties).sort()
    expect(sections, 'a new config section: audit its changes or list it as not edited through the API').toEqual(
      ['agent_defaults', 'agents', 'engines', 'image_config', ...NOT_EDITED_THROUGH_THE_API].sort(),
    )
    const engineFields = leaves(schema.properties.engines!.items!).sort()
    expect(Object.keys(ENGINE_FIELD_AUDIT).sort(), 'ENGINE_FIELD_AUDIT must name every engines[] field').toEqual(
      engineFields,
    )
    const agentFields = leaves(schema.properties.agents!.items!).sort()
    const unclassified = agentFields.filter((field) => !(field in AGENT_FIELD_AUDIT))
    expect(unclassified, 'add these agent fields to AGENT_FIELD_AUDIT in src/runtime/captain/weakenings.ts').toEqual([])
    expect(Object.keys(AGENT_FIELD_AUDIT).sort(), 'AGENT_FIELD_AUDIT names fields the schema does not have').toEqual(
      agentFields,
    )
    expect(leaves(schema.properties.agent_defaults!).every((field) => field in AGENT_FIELD_AUDIT)).toBe(true)
    const imageFields = leaves(schema.properties.image_config!).sort()
    expect(
      imageFields.filter((field) => !(field in IMAGE_CONFIG_FIELD_AUDIT)),
      'add these fields to IMAGE_CONFIG_FIELD_AUDIT',
    ).toEqual([])
    expect(Object.keys(IMAGE_CONFIG_FIELD_AUDIT).sort()).toEqual(imageFields)
  })

  it('the fields the issue names as loosening isolation are ruled on, not neutral', () => {
    for (const field of [
      'container_mode.user',
      'container_mode.image',
      'container_mode.network',
      'container_mode.memory_limit',
      'container_mode.pids_limit',
      'container_mode.cpus',
      'file_access.allow_listen',
      'file_access.allow_network',
      'file_access.allow_home_dotfiles',
      'file_access.best_effort',
      'file_access.unrestricted',
      'file_access.allow_read',
      'file_access.allow_read_write',
      'file_access.deny',
      'limits.memory',
      'limits.pids',
      'limits.cpus',
      'limits.disk',
    ]) {
      expect(AGENT_FIELD_AUDIT[field], field).not.toBe(NEUTRAL)
    }
    for (const field of ['inject_credentials_env', 'inject_secrets_env', 'image', 'base_image'])
      expect(IMAGE_CONFIG_FIELD_AUDIT[field], field).not.toBe(NEUTRAL)
  })

  it('every ruled field warns when loosened, and says nothing when tightened back', () => {
    expect(Object.keys(AGENT_LOOSENINGS).sort(), 'every ruled agent field needs a loosening example here').toEqual(
      ruled(AGENT_FIELD_AUDIT),
    )
    expect(
      Object.keys(IMAGE_LOOSENINGS).sort(),
      'every ruled image_config field needs a loosening example here',
    ).toEqual(ruled(IMAGE_CONFIG_FIELD_AUDIT))
    for (const [field, change] of Object.entries(AGENT_LOOSENINGS)) {
      const [before, after] = [agent(change.before), agent(change.after)]
      expect(agentWeakenings(before, after).filter(names(field)), field).toHaveLength(1)
      expect(agentWeakenings(after, before).filter(names(field)), `${field} tightened`).toEqual([])
    }
    for (const [field, change] of Object.entries(IMAGE_LOOSENINGS)) {
      const [before, after] = [image(change.before), image(change.after)]
      expect(imageConfigWeakenings(before, after).filter(names(field)), field).toHaveLength(1)
      if (!EVERY_CHANGE_WARNS.has(field))
        expect(imageConfigWeakenings(after, before).filter(names(field)), `${field} tightened`).toEqual([])
    }
  })

  it('an engine change that trusts another machine, or drops TLS, warns; going back says nothing', () => {
    expect(Object.keys(ENGINE_LOOSENINGS).sort()).toEqual(ruled(ENGINE_FIELD_AUDIT))
    for (const [field, change] of Object.entries(ENGINE_LOOSENINGS)) {
      const [before, after] = [engine(change.before), engine(change.after)]
      expect(engineWeakenings(before, after).filter(names(field)), field).toHaveLength(1)
    }
    expect(engineWeakenings(engine({insecure: true}), engine())).toEqual([])
  })

  it('a change of a neutral field gives up nothing', () => {
    expect(
      agentWeakenings(
        agent(),
        agent({
          name: 'Renamed',
          provider: 'other',
          model: 'other-model',
          max_iterations: 500,
          container_mode: {standby: false},
        }),
      ),
    ).toEqual([])
  })
})
