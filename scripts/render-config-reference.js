#!/usr/bin/env node
// Renders docs/config-reference.md from what the built CLI prints: `config schema` (every field,
// its type and constraints) and `config check --json` on a fresh home (the built-in defaults).
// `--check` exits 1 when the file on disk differs (test/docs/config-reference.test.ts runs it),
// so the reference cannot drift from the schema. Run `npm run docs` after changing the schema.
import {execFileSync} from 'node:child_process'
import fs from 'node:fs'
import os from 'node:os'
import path from 'node:path'
import {fileURLToPath} from 'node:url'

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..')
const target = path.join(root, 'docs', 'config-reference.md')

function cli(args, home) {
  return execFileSync(process.execPath, [path.join(root, 'bin', 'run.js'), ...args], {
    encoding: 'utf8',
    env: {PATH: process.env.PATH, MEEPAGATEWAY_HOME: home, NO_COLOR: '1'},
    stdio: ['ignore', 'pipe', 'pipe'],
  })
}

export function renderConfigReference() {
  const home = fs.mkdtempSync(path.join(os.tmpdir(), 'meepa-docs-'))
  try {
    const schema = JSON.parse(cli(['config', 'schema'], home))
    const {config: defaults} = JSON.parse(cli(['config', 'check', '--json'], home))
    return render(schema, defaults)
  } finally {
    fs.rmSync(home, {recursive: true, force: true})
  }
}

/**
 * The default at a dotted path: `agents[].x` and `agent_defaults.x` read the default agent. A
 * provider entry, an agent's id and name are examples in the default config, not defaults.
 */
function defaultAt(defaults, fieldPath) {
  if (fieldPath.includes('<name>') || /^(agents\[\]|agent_defaults)\.(id|name)$/.test(fieldPath)) return undefined
  const parts = fieldPath.replace(/^agent_defaults\./, 'agents[].').split('.')
  let value = defaults
  for (const part of parts) {
    if (value === undefined || value === null) return undefined
    if (part.endsWith('[]')) value = value[part.slice(0, -2)]?.[0]
    else value = value[part]
  }
  return value
}

function typeOf(node) {
  if (node.enum) return node.enum.map((v) => `\`${JSON.stringify(v)}\``).join(' | ')
  if (node.const !== undefined) return `\`${JSON.stringify(node.const)}\``
  if (node.type === 'array') return `array of ${node.items ? typeOf(node.items) : 'any'}`
  if (
    node.type === 'object' &&
    node.additionalProperties &&
    typeof node.additionalProperties === 'object' &&
    !node.properties
  ) {
    return `map of ${typeOf(node.additionalProperties)}`
  }
  return node.type ?? 'any'
}

function constraints(node) {
  const out = []
  if (node.pattern) out.push(`matches \`${node.pattern}\``)
  if (node.minLength !== undefined) out.push(`at least ${node.minLength} character${node.minLength === 1 ? '' : 's'}`)
  if (node.minimum !== undefined) out.push(`≥ ${node.minimum}`)
  if (node.exclusiveMinimum !== undefined) out.push(`> ${node.exclusiveMinimum}`)
  if (node.maximum !== undefined) out.push(`≤ ${node.maximum}`)
  if (node.minProperties !== undefined)
    out.push(`at least ${node.minProperties} entr${node.minProperties === 1 ? 'y' : 'ies'}`)
  if (node.items?.pattern) out.push(`items match \`${node.items.pattern}\``)
  if (node.propertyNames?.pattern) out.push(`names match \`${node.propertyNames.pattern}\``)
  if (node.additionalProperties === false && node.properties) out.push('no other keys')
  return out.join('; ')
}

const cell = (text) => String(text).replaceAll('|', '\\|').replaceAll('\n', ' ')
const shown = (value) => (value === undefined ? '' : `\`${JSON.stringify(value)}\``)

function rows(node, prefix, required, defaults, out) {
  for (const [name, child] of Object.entries(node.properties ?? {})) {
    if (Object.keys(child).length === 0) continue // `type: {}` in a connector variant: declared above
    const fieldPath = prefix ? `${prefix}.${name}` : name
    const isMap = child.type === 'object' && typeof child.additionalProperties === 'object' && !child.properties
    const isList = child.type === 'array' && child.items?.properties
    const isObject = child.type === 'object' && child.properties
    const leaf = !isObject && !(isMap && child.additionalProperties.properties) && !isList && !child.allOf
    out.push(
      `| \`${fieldPath}\` | ${cell(typeOf(child))} | ${required.includes(name) ? 'yes' : ''} | ${cell(leaf ? shown(child.default ?? defaultAt(defaults, fieldPath)) : '')} | ${cell(constraints(child))}${child.description ? ` ${cell(child.description)}` : ''} |`,
    )
    if (isObject) rows(child, fieldPath, child.required ?? [], defaults, out)
    if (isMap && child.additionalProperties.properties)
      rows(child.additionalProperties, `${fieldPath}.<name>`, child.additionalProperties.required ?? [], defaults, out)
    if (isList) rows(child.items, `${fieldPath}[]`, child.items.required ?? [], defaults, out)
    if (child.type === 'array' && child.items?.allOf) variants(child.items, `${fieldPath}[]`, out)
  }
}

/** `if type == X then {...}` branches (connectors): one table per variant. */
function variants(node, prefix, out) {
  for (const branch of node.allOf ?? []) {
    const kind = branch.if?.properties?.type?.const
    if (!kind || !branch.then) continue
    out.push(`| *\`${prefix}\` with \`type: ${kind}\`* | | | | |`)
    rows(branch.then, prefix, branch.then.required ?? [], {}, out)
  }
}

export function render(schema, defaults) {
  const out = [
    '# Configuration reference',
    '',
    '<!-- Generated by scripts/render-config-reference.js from `meepagateway config schema` and the',
    '     built-in defaults (`config check --json` on a fresh home). Do not edit: run `npm run docs`. -->',
    '',
    '`config.yaml` lives in `$MEEPAGATEWAY_HOME` (default `~/.meepagateway`; `--config PATH` overrides it).',
    'A value written `$NAME` or `${NAME}` is read from the environment when the config loads. An agent',
    "field resolves as: the agent's own value, then `agent_defaults`, then the built-in default below.",
    '`meepagateway config check` validates the file and prints it resolved, secrets masked;',
    '`meepagateway config schema` prints the JSON Schema this page is rendered from.',
    '',
  ]
  for (const [section, node] of Object.entries(schema.properties)) {
    out.push(`## \`${section}\`${(schema.required ?? []).includes(section) ? ' (required)' : ''}`, '')
    out.push('| field | type | required | default | constraints |', '|---|---|---|---|---|')
    const table = []
    if (node.type === 'array' && node.items?.properties)
      rows(node.items, `${section}[]`, node.items.required ?? [], defaults, table)
    else if (node.properties) rows(node, section, node.required ?? [], defaults, table)
    else
      table.push(
        `| \`${section}\` | ${cell(typeOf(node))} | | ${shown(defaultAt(defaults, section))} | ${cell(constraints(node))} |`,
      )
    out.push(...table, '')
  }
  return `${out.join('\n').trimEnd()}\n`
}

if (process.argv[1] === fileURLToPath(import.meta.url)) {
  const text = renderConfigReference()
  if (process.argv.includes('--check')) {
    const current = fs.existsSync(target) ? fs.readFileSync(target, 'utf8') : ''
    if (current !== text) {
      process.stderr.write('docs/config-reference.md is out of date with `config schema`.\n  Try this: npm run docs\n')
      process.exit(1)
    }
  } else {
    fs.mkdirSync(path.dirname(target), {recursive: true})
    fs.writeFileSync(target, text)
  }
}
