import {execFileSync} from 'node:child_process'
import fs from 'node:fs'
import path from 'node:path'
import {describe, expect, it} from 'vitest'
import {ROOT} from '../helpers/home.js'

const tracked = () =>
  execFileSync('git', ['ls-files', '-co', '--exclude-standard'], {cwd: ROOT, encoding: 'utf8'})
    .split('\n')
    .filter((file) => file && fs.existsSync(path.join(ROOT, file)))
const text = (file: string) => fs.readFileSync(path.join(ROOT, file), 'utf8')
const isText = (file: string) =>
  /\.(ts|js|mjs|cjs|json|md|sh|yaml|yml|c|h|html|css)$|^\.ci\/|^bin\//.test(file) && file !== 'package-lock.json'

describe('the repository stands alone', () => {
  it('no file refers to the design notes or folders outside the repository', () => {
    const offenders: string[] = []
    for (const file of tracked().filter(isText)) {
      if (file === 'test/docs/standalone.test.ts') continue
      const body = text(file)
      for (const pattern of [/\.\.\/shared\b/, /\bDESIGN\.md\b/, /\/work\/(?:shared|wt|main)\b/])
        if (pattern.test(body)) offenders.push(`${file}: ${pattern}`)
    }
    expect(offenders).toEqual([])
  })

  it('every relative link in the Markdown files stays inside the repository and (but for files other work adds) exists', () => {
    const problems: string[] = []
    for (const file of tracked().filter((f) => f.endsWith('.md'))) {
      for (const [, target] of text(file).matchAll(/\]\(([^)#\s]+)(?:#[^)]*)?\)/g)) {
        if (!target || /^[a-z]+:/i.test(target)) continue
        const resolved = path.resolve(ROOT, path.dirname(file), target)
        if (path.relative(ROOT, resolved).startsWith('..')) problems.push(`${file}: ${target} leaves the repository`)
        // docs/agent-run.md is written by the provider-channel work, merged separately
        else if (!fs.existsSync(resolved) && !resolved.endsWith('docs/agent-run.md'))
          problems.push(`${file}: ${target} does not exist`)
      }
    }
    expect(problems).toEqual([])
  })

  it("docs/config-reference.md is what the built CLI's `config schema` renders to (run `npm run docs` after a schema change)", () => {
    const result = (() => {
      try {
        execFileSync(process.execPath, [path.join(ROOT, 'scripts/render-config-reference.js'), '--check'], {
          cwd: ROOT,
          stdio: 'pipe',
        })
        return 0
      } catch (error) {
        return (error as {status: number}).status
      }
    })()
    expect(result).toBe(0)
  })
})
