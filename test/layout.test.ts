import fs from 'node:fs'
import path from 'node:path'
import {describe, expect, it} from 'vitest'
import {ROOT} from './helpers/home.js'

// The import rules of docs/layout.md: each folder of src/ is one capability and may import only
// what its row allows. A forbidden import fails here with the file, the line and the rule.
const SRC = path.join(ROOT, 'src')
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

const SPECIFIER =
  /(?:^|[\s;])(import\s+type\s[^'"]*?from\s*|export\s+type\s[^'"]*?from\s*|import\s[^'"]*?from\s*|export\s[^'"]*?from\s*|import\s*\(\s*|import\s+)(['"])([^'"\n]+)\2/g

function importsOf(file: string): Array<Import | {from: string; pkg: string}> {
  const text = fs
    .readFileSync(file, 'utf8')
    .replace(/\/\*[\s\S]*?\*\//g, '')
    .replace(/^\s*\/\/.*$/gm, '')
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

/**
 * Which folders each folder may import (docs/layout.md, "Import rules"); its own files always.
 * Folders, never single files: a file needed across layers moves to the layer that needs it.
 */
const BELOW_RUNNERS = [
  'util',
  'config',
  'shapes',
  'state',
  'workspace',
  'providers',
  'agent',
  'agent-run',
  'llm-channel',
]
const GATEWAY_SIDE = ['gateway', 'connectors', 'http', 'captain']
const RUNTIME = [...BELOW_RUNNERS, 'run-lifecycle', 'host-sandbox', 'container', 'runners', 'send', ...GATEWAY_SIDE]
const MAY_IMPORT: Record<string, {runtime: string[]; sandbox: boolean}> = {
  commands: {runtime: RUNTIME, sandbox: false},
  cli: {runtime: RUNTIME, sandbox: false},
  'runtime/util': {runtime: [], sandbox: false},
  'runtime/config': {runtime: ['util'], sandbox: false},
  'runtime/shapes': {runtime: ['util', 'config'], sandbox: false},
  'runtime/state': {runtime: ['util', 'config', 'shapes'], sandbox: false},
  'runtime/workspace': {runtime: ['util', 'config', 'shapes', 'state'], sandbox: false},
  'runtime/providers': {runtime: ['util', 'config', 'shapes'], sandbox: false},
  'runtime/agent': {runtime: ['util', 'config', 'shapes', 'workspace', 'providers'], sandbox: false},
  'runtime/agent-run': {
    runtime: ['util', 'config', 'shapes', 'state', 'workspace', 'providers', 'agent'],
    sandbox: false,
  },
  'runtime/llm-channel': {runtime: ['util', 'config', 'shapes', 'providers', 'agent-run'], sandbox: false},
  'runtime/run-lifecycle': {runtime: BELOW_RUNNERS, sandbox: true},
  'runtime/host-sandbox': {runtime: [...BELOW_RUNNERS, 'run-lifecycle'], sandbox: true},
  'runtime/container': {runtime: [...BELOW_RUNNERS, 'run-lifecycle'], sandbox: true},
  'runtime/runners': {runtime: [...BELOW_RUNNERS, 'run-lifecycle', 'host-sandbox', 'container'], sandbox: true},
  'runtime/send': {runtime: [...BELOW_RUNNERS, 'run-lifecycle', 'runners'], sandbox: false},
  'runtime/gateway': {runtime: RUNTIME, sandbox: true},
  'runtime/connectors': {runtime: RUNTIME, sandbox: true},
  'runtime/http': {runtime: RUNTIME, sandbox: true},
  'runtime/captain': {runtime: RUNTIME, sandbox: true},
}

function allowed(zone: string, imp: Import): boolean {
  const target = zoneOf(imp.to)
  if (target === zone) return true
  if (zone === 'sandbox') {
    // the isolated program's own interface (which files it is, how it starts) and the shapes it is
    // handed; the config's types, never its code; nothing of the gateway
    return (
      ['runtime/util', 'runtime/shapes', 'runtime/agent-run'].includes(target) ||
      (imp.typeOnly && target === 'runtime/config')
    )
  }
  const rule = MAY_IMPORT[zone]
  if (!rule) return false
  if (target === 'sandbox') return rule.sandbox
  // the commands colour their output as the lite CLI does (src/cli/colour.ts)
  if (target === 'cli') return zone === 'commands'
  return target.startsWith('runtime/') && rule.runtime.includes(target.slice('runtime/'.length))
}

/**
 * A cycle of folders importing each other (directly or through a chain), each arrow with an import
 * that makes it; none when the graph is one-way.
 */
function folderCycle(imports: Import[]): string[] | undefined {
  const arrows = new Map<string, Map<string, string>>()
  for (const imp of imports) {
    const [from, to] = [zoneOf(imp.from), zoneOf(imp.to)]
    if (from === to) continue
    if (!arrows.has(from)) arrows.set(from, new Map())
    if (!arrows.get(from)!.has(to)) arrows.get(from)!.set(to, `src/${imp.from} imports ${imp.specifier}`)
  }
  const done = new Set<string>()
  const path: string[] = []
  const visit = (folder: string): string[] | undefined => {
    const open = path.indexOf(folder)
    if (open >= 0) {
      const loop = [...path.slice(open), folder]
      return loop.slice(1).map((to, i) => `${loop[i]} -> ${to} (${arrows.get(loop[i]!)!.get(to)})`)
    }
    if (done.has(folder)) return undefined
    path.push(folder)
    for (const next of arrows.get(folder)?.keys() ?? []) {
      const cycle = visit(next)
      if (cycle) return cycle
    }
    path.pop()
    done.add(folder)
    return undefined
  }
  for (const folder of arrows.keys()) {
    const cycle = visit(folder)
    if (cycle) return cycle
  }
  return undefined
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

  it('no two folders import each other, directly or through a chain', () => {
    expect(folderCycle(all.filter((imp): imp is Import => 'to' in imp))).toBeUndefined()
  })

  it('every folder of src/runtime/ has its rule (a new folder is placed in the layers first)', () => {
    const folders = fs
      .readdirSync(path.join(SRC, 'runtime'), {withFileTypes: true})
      .filter((entry) => entry.isDirectory())
    expect(folders.map((entry) => `runtime/${entry.name}`).filter((zone) => !(zone in MAY_IMPORT))).toEqual([])
  })

  it('test/runtime/ and test/sandbox/ mirror src/: every test folder there is a folder of src/', () => {
    const folders = (dir: string): string[] =>
      fs
        .readdirSync(dir, {withFileTypes: true})
        .flatMap((entry) =>
          entry.isDirectory() ? [path.join(dir, entry.name), ...folders(path.join(dir, entry.name))] : [],
        )
    const testRoot = path.join(ROOT, 'test')
    const unmirrored = ['runtime', 'sandbox']
      .flatMap((top) => folders(path.join(testRoot, top)))
      .map((dir) => path.relative(testRoot, dir))
    expect(unmirrored.filter((dir) => !fs.existsSync(path.join(SRC, dir)))).toEqual([])
  })

  it('the agent loop imports nothing from src/sandbox/ (it does not know where it runs)', () => {
    const offenders = all.filter(
      (imp) => 'to' in imp && zoneOf(imp.from) === 'runtime/agent' && zoneOf(imp.to) === 'sandbox',
    )
    expect(offenders).toEqual([])
  })

  it('only commands use @oclif/core, and only they and the lite CLI chalk; the runtime and the sandbox are libraries', () => {
    const offenders = all.filter(
      (imp) =>
        'pkg' in imp &&
        /^(@oclif\/core|chalk)(\/|$)/.test(imp.pkg) &&
        zoneOf(imp.from) !== 'commands' &&
        !(imp.pkg === 'chalk' && zoneOf(imp.from) === 'cli'),
    )
    expect(offenders).toEqual([])
  })

  it('the rules see real imports (a parse that found nothing would pass vacuously)', () => {
    expect(all.some((imp) => 'to' in imp && imp.from === path.join('runtime', 'agent', 'loop.ts'))).toBe(true)
    expect(all.some((imp) => 'to' in imp && imp.typeOnly)).toBe(true)
    expect(
      allowed('sandbox', {
        from: 'sandbox/x.ts',
        to: path.join('runtime', 'gateway', 'gateway.ts'),
        specifier: '',
        typeOnly: false,
      }),
    ).toBe(false)
    const imp = (from: string, to: string): Import => ({
      from: path.join('runtime', from, 'x.ts'),
      to: path.join('runtime', to, 'y.ts'),
      specifier: `../${to}/y.js`,
      typeOnly: false,
    })
    expect(folderCycle([imp('a', 'b'), imp('b', 'c')])).toBeUndefined()
    expect(folderCycle([imp('a', 'b'), imp('b', 'c'), imp('c', 'a')])).toEqual([
      'runtime/a -> runtime/b (src/runtime/a/x.ts imports ../b/y.js)',
      'runtime/b -> runtime/c (src/runtime/b/x.ts imports ../c/y.js)',
      'runtime/c -> runtime/a (src/runtime/c/x.ts imports ../a/y.js)',
    ])
  })
})
