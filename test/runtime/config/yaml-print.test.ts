import {describe, expect, it} from 'vitest'
import YAML from 'yaml'
import {parseConfigText} from '../../../src/runtime/config/load.js'
import {DEFAULT_CONFIG_YAML} from '../../../src/runtime/config/defaults.js'
import {describeConfig} from '../../../src/runtime/config/report.js'
import {plainYaml, printYaml} from '../../../src/runtime/config/yaml-print.js'
import {seededRandom} from '../../helpers/seeded-random.js'

// printYaml writes what YAML.stringify writes, byte for byte, without the library where it can:
// compared with the library over generated values full of strings YAML treats specially.

const TRICKY = [
  '',
  'true',
  'True',
  'TRUE',
  'false',
  'null',
  'Null',
  'NULL',
  '~',
  '~/x',
  '-',
  '?',
  '-x',
  '?x',
  '- x',
  'a: b',
  'a:',
  ':a',
  'a:b',
  '#x',
  'a#b',
  'a #b',
  '@x',
  '*x',
  '&x',
  '!x',
  '%x',
  '`x',
  "'x",
  '"x',
  'x"y',
  "x'y",
  '|x',
  '>x',
  ',x',
  'x,y',
  '[x]',
  '{x}',
  'x]',
  '0x1F',
  '0x',
  '0o17',
  '0o8',
  '1e3',
  '1E-3',
  '.5',
  '1.',
  '+1',
  '-1',
  '007',
  '1_000',
  '.inf',
  '-.Inf',
  '.nan',
  'NaN',
  'yes',
  'no',
  'on',
  'off',
  'y',
  'n',
  '---',
  '...',
  '--',
  '---x',
  '...x',
  'a b',
  ' a',
  'a ',
  'é',
  'tab\t',
  'new\nline',
  'back\\slash',
  'http://127.0.0.1:1/v1',
  'debian:bookworm-slim',
  '512m',
  '127.0.0.1',
  '********',
  'sk-abc_DEF.123',
  'x'.repeat(120),
  'y'.repeat(201),
  `${'word '.repeat(30)}end`,
]
const PRINTABLE = Array.from({length: 95}, (_, i) => String.fromCharCode(32 + i)).join('')

function generate(rand: () => number, depth: number, shared: object[]): unknown {
  const roll = rand()
  const pick = <T>(items: readonly T[]): T => items[Math.floor(rand() * items.length)] as T
  const text = () =>
    rand() < 0.6
      ? pick(TRICKY)
      : Array.from({length: Math.floor(rand() * 12)}, () => PRINTABLE[Math.floor(rand() * PRINTABLE.length)]).join('')
  if (depth > 0 && roll < 0.3) {
    const object: Record<string, unknown> = {}
    for (let i = Math.floor(rand() * 5); i > 0; i--) object[text()] = generate(rand, depth - 1, shared)
    if (rand() < 0.05) shared.push(object)
    return object
  }
  if (depth > 0 && roll < 0.5)
    return Array.from({length: Math.floor(rand() * 4)}, () => generate(rand, depth - 1, shared))
  if (shared.length > 0 && roll < 0.52) return pick(shared)
  if (roll < 0.75) return text()
  if (roll < 0.9)
    return pick([0, 1, -5, 42, 0.5, -2.25, 1e21, 1e-7, -0, Number.NaN, Number.POSITIVE_INFINITY, 512, 63372])
  return pick([true, false, null, undefined])
}

describe('printYaml', () => {
  it('writes what YAML.stringify writes, over 3000 generated values', () => {
    let plain = 0
    for (let seed = 1; seed <= 3000; seed++) {
      const value = generate(seededRandom(seed), 4, [])
      expect({seed, yaml: printYaml(value)}).toEqual({seed, yaml: YAML.stringify(value)})
      if (plainYaml(value) !== undefined) plain++
    }
    expect(plain).toBeGreaterThan(300) // the comparison does reach the fast path
  })

  it('writes every string of the tricky list as the library does, as a value and as a key', () => {
    for (const text of TRICKY) {
      for (const value of [{key: text}, {[text]: 1}, [text], {list: [{[text]: [text]}]}])
        expect({text, yaml: printYaml(value)}).toEqual({text, yaml: YAML.stringify(value)})
    }
  })

  it('prints a resolved config without the library: the default config and one with masked secrets', () => {
    const resolved = parseConfigText(DEFAULT_CONFIG_YAML, 'default', {}).config
    expect(plainYaml(resolved)).toBe(YAML.stringify(resolved))
    const withSecrets = parseConfigText(
      'providers:\n  primary: a\n  providers:\n    a: {kind: anthropic, api_key_env: KEY, model: claude-sonnet-4-5}\nagents:\n  - id: bot\n    connectors: [{type: discord, bot_token: $TOKEN}]\n',
      'secrets',
      {KEY: 'sk-secret', TOKEN: 'discord-token'},
    )
    const report = describeConfig({...withSecrets, path: '/x/config.yaml', home: '/x', created: false})
    expect(report.yaml).toContain('bot_token: "********"')
    expect(plainYaml(report.config)).toBe(YAML.stringify(report.config))
  })
})
