import {execa} from 'execa'
import path from 'node:path'
import {describe, expect, it} from 'vitest'
import {ROOT} from '../helpers/home.js'

// src/cli/lite/oclif-output.ts and print-error.ts copy what decides what a user sees of oclif (its CLIError, error
// printer and JSON printer) instead of loading oclif's private files. Each copy is compared here
// with oclif's own through oclif's public API (Errors.CLIError, ux.error, ux.colorizeJson), in a
// process of its own for each colour setting (oclif decides colour once, as it loads).

const SCRIPT = `
const {createRequire} = require('node:module')
const oclif = createRequire(${JSON.stringify(path.join(ROOT, 'package.json'))})('@oclif/core')
;(async () => {
  const ours = {...await import(${JSON.stringify(path.join(ROOT, 'dist', 'cli', 'lite', 'oclif-output.js'))}), ...await import(${JSON.stringify(path.join(ROOT, 'dist', 'cli', 'lite', 'print-error.js'))})}
  const printedByOclif = (error) => {
    const lines = []
    const original = console.error
    console.error = (text) => lines.push(text)
    try { oclif.ux.error(error, {exit: false}) } finally { console.error = original }
    return lines.join('\\n')
  }
  const errors = (CLIError) => {
    const cause = new CLIError('the cause of it all', {code: 'E_CAUSE'})
    return [
      new CLIError('short'),
      new CLIError('a message long enough to be wrapped at the width of the terminal, which is eighty columns when stderr is not one, with words that go on'),
      new CLIError('x'.repeat(150) + ' unbroken', {code: 'E_LONG', exit: 9}),
      new CLIError('one suggestion', {code: 'E_ONE', exit: 3, suggestions: ['do this']}),
      new CLIError('two\\nlines', {code: 'E_TWO', exit: 4, suggestions: ['first fix, also long enough to need wrapping when indented by the printer as oclif does', 'second fix']}),
      Object.assign(new CLIError('with a ref'), {ref: 'https://example.invalid/ref'}),
      Object.assign(new CLIError('caused'), {cause}),
      Object.defineProperty(Object.assign(new CLIError('coloured'), {name: '\\u001B[1m\\u001B[31mError\\u001B[39m\\u001B[22m'}), 'bang', {value: '\\u001B[31m›\\u001B[39m'}),
    ]
  }
  const fields = (error) => ({message: error.message, name: error.name, code: error.code, oclif: {...error.oclif}, suggestions: error.suggestions, own: Object.keys(error)})
  const circular = {a: [1, -2.5e-7, 'q"uo\\\\te', true, null, {}], b: {c: []}, u: undefined}
  circular.b.self = circular
  circular.b.c.push(circular.b)
  const values = [circular, [], 42, 'null', {nested: {deep: [{x: 1}]}}, '{"from":"text"}']
  const side = (CLIError, print, json) => ({
    errors: errors(CLIError).map((error) => ({fields: fields(error), printed: print(error)})),
    json: values.map((value) => json(value, {pretty: true})),
  })
  console.log(JSON.stringify({
    ours: side(ours.CLIError, ours.prettyPrint, ours.colorizeJson),
    oclif: side(oclif.Errors.CLIError, printedByOclif, oclif.ux.colorizeJson),
  }))
})()
`

async function compare(env: Record<string, string>): Promise<{ours: unknown; oclif: unknown}> {
  const result = await execa(process.execPath, ['-e', SCRIPT], {
    env: {PATH: process.env.PATH ?? '', ...env},
    extendEnv: false,
    cwd: ROOT,
  })
  return JSON.parse(result.stdout) as {ours: unknown; oclif: unknown}
}

describe("the lite CLI's copy of oclif's output (src/cli/lite/oclif-output.ts, print-error.ts)", () => {
  it('prints errors and JSON as oclif does, with colour off (a pipe)', async () => {
    const {ours, oclif} = await compare({})
    expect(ours).toEqual(oclif)
    expect(JSON.stringify(ours)).toContain('[Circular ~')
  })

  it('the same with colour forced on (its red marker) and at another width', async () => {
    const forced = await compare({FORCE_COLOR: '1'})
    expect(forced.ours).toEqual(forced.oclif)
    expect(JSON.stringify(forced.ours)).toContain('\\u001b[31m›')
    const narrow = await compare({OCLIF_COLUMNS: '50'})
    expect(narrow.ours).toEqual(narrow.oclif)
  })
})
