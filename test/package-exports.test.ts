import fs from 'node:fs'
import {builtinModules} from 'node:module'
import path from 'node:path'
import {describe, expect, it} from 'vitest'
import {ROOT} from './helpers/home.js'

// No code loads a file of a package that the package does not export: such a file is the
// package's private business, free to move in any release (the lite CLI once loaded three of
// @oclif/core's by path). Every package specifier of src/, bin/, scripts/, bench/ and test/ is
// checked against its package.json `exports`, and reaching into a package by its resolved path
// (path.dirname(require.resolve(...))) is refused outright.

const DIRS = ['src', 'bin', 'scripts', 'bench', 'test']
const SPECIFIER = /(?:\bfrom\s*|\bimport\s*\(\s*|\bimport\s+|\brequire\s*\(\s*|\bvi\.mock\s*\(\s*)(['"])([^'"\n]+)\1/g
const BUILTINS = new Set(builtinModules)

function codeFiles(dir: string): string[] {
  if (!fs.existsSync(dir)) return []
  return fs.readdirSync(dir, {withFileTypes: true}).flatMap((entry) => {
    const file = path.join(dir, entry.name)
    if (entry.isDirectory()) return ['node_modules', 'results', 'fixtures'].includes(entry.name) ? [] : codeFiles(file)
    return /\.(ts|js|cjs|mjs)$/.test(entry.name) ? [file] : []
  })
}

function withoutComments(text: string): string {
  return text.replace(/\/\*[\s\S]*?\*\//g, '').replace(/^\s*\/\/.*$/gm, '')
}

/** The package a bare specifier names and the subpath it asks for ('.' for the package itself). */
export function splitSpecifier(specifier: string): {name: string; subpath: string} {
  const parts = specifier.split('/')
  const size = specifier.startsWith('@') ? 2 : 1
  const rest = parts.slice(size).join('/')
  return {name: parts.slice(0, size).join('/'), subpath: rest ? `./${rest}` : '.'}
}

/** Whether a package's `exports` (undefined: no field, every file public) lets `subpath` be loaded. */
export function exported(exports: unknown, subpath: string): boolean {
  if (exports === undefined) return true
  const keys = exports !== null && typeof exports === 'object' && !Array.isArray(exports) ? Object.keys(exports) : []
  if (!keys.some((key) => key.startsWith('.'))) return subpath === '.' // a string, an array or conditions: the package itself only
  const map = exports as Record<string, unknown>
  if (subpath in map) return map[subpath] !== null
  // the pattern with the longest prefix before its `*` decides (a null target hides what a wider one shows)
  const patterns = keys.filter((key) => {
    const star = key.indexOf('*')
    if (star === -1) return false
    const [before, after] = [key.slice(0, star), key.slice(star + 1)]
    return subpath.startsWith(before) && subpath.endsWith(after) && subpath.length >= before.length + after.length
  })
  const best = patterns.sort((a, b) => b.indexOf('*') - a.indexOf('*'))[0]
  return best !== undefined && map[best] !== null
}

function packageExports(name: string): {found: boolean; exports?: unknown} {
  const manifest = path.join(ROOT, 'node_modules', name, 'package.json')
  if (!fs.existsSync(manifest)) return {found: false}
  return {found: true, exports: (JSON.parse(fs.readFileSync(manifest, 'utf8')) as {exports?: unknown}).exports}
}

describe('package exports', () => {
  const files = DIRS.flatMap((dir) => codeFiles(path.join(ROOT, dir)))

  it('reads exports as Node does (a check that cannot pass everything)', () => {
    const oclif = packageExports('@oclif/core').exports
    expect(exported(oclif, './errors')).toBe(true)
    expect(exported(oclif, './lib/errors/errors/cli.js')).toBe(false)
    expect(exported(oclif, './lib/ux/colorize-json.js')).toBe(false)
    expect(exported('./index.js', './lib/x.js')).toBe(false)
    expect(exported({'./*': './lib/*.js', './private/*': null}, './a')).toBe(true)
    expect(exported({'./*': './lib/*.js', './private/*': null}, './private/a')).toBe(false)
    expect(exported(undefined, './anything.js')).toBe(true)
    expect(splitSpecifier('@oclif/core/errors')).toEqual({name: '@oclif/core', subpath: './errors'})
  })

  it("no code imports a package file outside the package's exports", () => {
    const offenders: string[] = []
    for (const file of files) {
      const text = withoutComments(fs.readFileSync(file, 'utf8'))
      for (const [, , specifier = ''] of text.matchAll(SPECIFIER)) {
        if (/^(\.|\/|node:|#)/.test(specifier) || BUILTINS.has(specifier) || specifier.includes('${')) continue
        const {name, subpath} = splitSpecifier(specifier)
        const pkg = packageExports(name)
        if (!pkg.found) continue // not a package of ours (a name inside a string, a bundle alias)
        if (!exported(pkg.exports, subpath)) offenders.push(`${path.relative(ROOT, file)}: ${specifier}`)
      }
    }
    expect(offenders).toEqual([])
  })

  it('no code reaches into a package by its resolved path', () => {
    const offenders = files
      .filter((file) => /path\.dirname\(\s*require\.resolve\(/.test(withoutComments(fs.readFileSync(file, 'utf8'))))
      .map((file) => path.relative(ROOT, file))
    expect(offenders).toEqual([])
  })
})
