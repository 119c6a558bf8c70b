import fs from 'node:fs'
import path from 'node:path'
import {describe, expect, it} from 'vitest'
import {ROOT} from './helpers/home.js'

// The import rules of docs/layout.md: each folder of src/ is one capability and may import only
// what its row allows. A forbidden import fails here with the file, the line and the rule.
const SRC = path.join(ROOT, 'src')
const GATEWAY_SIDE = ['gateway', 'connectors', 'http', 'captain']

interface Import {
  from: string // importing file, relative to src/
  to: string // imported file, relative to src/ (source .ts)
  specifier: string
  typeOnly: boolean
}

function sourceFiles(dir = SRC): string[] {
  return fs.readdirSync(dir, {withFileTypes: true}).flatMap((entry) => {
    const file = path.join(dir, entry.name)
    if (entry.isDirectory()) return sourceFiles(file)
    return /\.(ts|js)$/.test(entry.name) ? [file] : []
  })
}

const SPECIFIER = /(?:^|[\s;])(import\s+type\s[^'"]*?from\s*|export\s+type\s[^'"]*?from\s*|import\s[^'"]*?from\s*|export\s[^'"]*?from\s*|import\s*\(\s*|import\s+)(['"])([^'"\n]+)\2/g

function importsOf(file: string): Array<Import | {from: string; pkg: string}> {
  const text = fs.readFileSync(file, 'utf8').replace(/\/\*[\s\S]*?\*\//g, '').replace(/^\s*\/\/.*$/gm, '')
  const from = path.relative(SRC, file)
  const out: Array<Import | {from: string; pkg: string}> = []
  for (const [, lead = '', , specifier = ''] of text.matchAll(SPECIFIER)) {
    if (!specifier.startsWith('.')) {
      out.push({from, pkg: specifier})
      continue
    }
    const target = path.resolve(path.dirname(file), specifier).replace(/\.js$/, '.ts')
    out.push({from, to: path.relative(SRC, target), specifier, typeOnly: /^(import|export)\s+type\s/.test(lead)})
  }
  return out
}

/** The capability a file belongs to: `commands`, `sandbox`, `runtime/<folder>`, or `runtime/` for a loose file. */
function zoneOf(relative: string): string {
  const [top, second, third] = relative.split(path.sep)
  if (top === 'runtime') return third === undefined ? 'runtime/' : `runtime/${second}`
  return top ?? ''
}

/** Which imports a zone may make (docs/layout.md, "Import rules"). */
function allowed(zone: string, imp: Import): boolean {
  const target = zoneOf(imp.to)
  const folder = target.slice('runtime/'.length)
  const inRuntime = target.startsWith('runtime/')
  if (target === zone) return true
  // the base layer every runtime folder may name: the agent-run contract, the providers' message types, the isolation level
  if (zone.startsWith('runtime/') && target === 'runtime/shapes') return true
  switch (zone) {
    case 'commands':
    case 'cli':
      return inRuntime
    case 'runtime/util':
      return false
    case 'runtime/config':
      return ['util'].includes(folder)
    case 'runtime/shapes':
      return ['util', 'config'].includes(folder)
    case 'runtime/state':
      return ['util', 'config'].includes(folder)
    case 'runtime/workspace':
      return ['util', 'config', 'state'].includes(folder)
    case 'runtime/providers':
      return ['util', 'config', 'agent-run'].includes(folder)
    case 'runtime/agent':
      return ['util', 'config', 'workspace', 'providers'].includes(folder)
    case 'runtime/agent-run':
      return inRuntime && !GATEWAY_SIDE.includes(folder)
    case 'runtime/runners':
    case 'runtime/host-sandbox':
    case 'runtime/container':
      return (inRuntime && !GATEWAY_SIDE.includes(folder)) || target === 'sandbox'
    case 'runtime/gateway':
    case 'runtime/connectors':
    case 'runtime/http':
    case 'runtime/captain':
      return inRuntime || target === 'sandbox'
    case 'sandbox':
      // the isolated program's own interface (which files it is, how it starts) is not the gateway
      return ['util', 'shapes', 'agent-run'].includes(folder) || (imp.typeOnly && imp.to === path.join('runtime', 'config', 'types.ts'))
    default:
      return false
  }
}

const all = sourceFiles().flatMap(importsOf)

describe('source layout (docs/layout.md)', () => {
  it('no loose files at the root of src/runtime/: every capability has its folder', () => {
    const loose = fs.readdirSync(path.join(SRC, 'runtime'), {withFileTypes: true}).filter((entry) => entry.isFile())
    expect(loose.map((entry) => `src/runtime/${entry.name}`)).toEqual([])
  })

  it('every relative import stays within what its folder may import', () => {
    const forbidden = all
      .filter((imp): imp is Import => 'to' in imp)
      .filter((imp) => !allowed(zoneOf(imp.from), imp))
      .map((imp) => `src/${imp.from} imports ${imp.specifier} (${zoneOf(imp.from)} -> ${zoneOf(imp.to)})`)
    expect(forbidden).toEqual([])
  })

  it('the agent loop imports nothing from src/sandbox/ (it does not know where it runs)', () => {
    const offenders = all.filter((imp) => 'to' in imp && zoneOf(imp.from) === 'runtime/agent' && zoneOf(imp.to) === 'sandbox')
    expect(offenders).toEqual([])
  })

  it('only commands use @oclif/core and chalk; the runtime and the sandbox are libraries', () => {
    const offenders = all.filter((imp) => 'pkg' in imp && /^(@oclif\/core|chalk)(\/|$)/.test(imp.pkg) && zoneOf(imp.from) !== 'commands')
    expect(offenders).toEqual([])
  })

  it('the rules see real imports (a parse that found nothing would pass vacuously)', () => {
    expect(all.some((imp) => 'to' in imp && imp.from === path.join('runtime', 'agent', 'loop.ts'))).toBe(true)
    expect(all.some((imp) => 'to' in imp && imp.typeOnly)).toBe(true)
    expect(allowed('sandbox', {from: 'sandbox/x.ts', to: path.join('runtime', 'gateway', 'gateway.ts'), specifier: '', typeOnly: false})).toBe(false)
  })
})
