import {execa} from 'execa'
import fs from 'node:fs'
import os from 'node:os'
import path from 'node:path'
import vm from 'node:vm'
import {expect, it} from 'vitest'
import {ROOT} from '../helpers/home.js'

const dist = path.join(ROOT, 'dist')

// agent-run runs from one bundled file: a bundle older than the code it was made from would run
// yesterday's agent-run under every isolation level, the same trap as a stale manifest.
it('agent-run is bundled from the current build of its sources', () => {
  const bundled = fs.statSync(path.join(dist, 'agent-run.cjs')).mtimeMs
  const runtime = path.join(dist, 'runtime')
  const stale = fs
    .readdirSync(runtime, {recursive: true, encoding: 'utf8'})
    .filter((file) => file.endsWith('.js') && fs.statSync(path.join(runtime, file)).mtimeMs > bundled)
  expect(stale).toEqual([])
})

it("this Node accepts the bundle's V8 code cache (agent-run starts without compiling it)", async () => {
  const check =
    "import('./dist/runtime/agent-run/bundle.js').then((bundle) => process.stdout.write(bundle.agentRunCodeCacheStatus()))"
  expect((await execa(process.execPath, ['--input-type=module', '-e', check], {cwd: ROOT})).stdout).toBe('accepted')
})

// bin/cli-bundle.cjs reads every bundle as latin1: a non-ASCII byte left in one would turn a
// character of a string or a regular expression into two (scripts/bundle-format.js escapes them).
it('every bundle the loader reads is pure ASCII, and an escaped regular expression still matches what it did', async () => {
  const bundles = [
    'agent-run.cjs',
    'agent-run-providers.cjs',
    'cli.cjs',
    ...fs
      .readdirSync(path.join(dist, 'lite'))
      .filter((file) => file.endsWith('.cjs'))
      .map((file) => `lite/${file}`),
  ]
  expect(bundles.length).toBeGreaterThan(5)
  for (const bundle of bundles) {
    const bytes = fs.readFileSync(path.join(dist, bundle))
    expect(
      bytes.findIndex((byte) => byte > 0x7f),
      bundle,
    ).toBe(-1)
    // and each built-in's exports are copied once, not once per module that imports it
    expect(bytes.toString('latin1'), bundle).not.toMatch(/__toESM\(require\("node:/)
  }
  // ansis's strip() was written with a raw U+009B in a character class: read as latin1 it became
  // two characters, and the class also matched "Â"
  const {finishBundle} = (await import(path.join(ROOT, 'scripts', 'bundle-format.js'))) as {
    finishBundle(file: string): void
  }
  const file = path.join(fs.mkdtempSync(path.join(os.tmpdir(), 'meepa-ascii-')), 'strip.js')
  const asTheLoaderReadsIt = () => vm.runInThisContext(fs.readFileSync(file, 'latin1')) as (text: string) => string
  try {
    // the raw characters, written as UTF-8, as in ansis's published file
    fs.writeFileSync(file, '(text) => text.replace(/[\u001b\u009b][[()#;?]*[0-9;]*m/g, "")\n')
    expect(asTheLoaderReadsIt()('\u009b31mred\u001b[0m Â1m')).toBe('red ') // the defect, as it was
    finishBundle(file)
    expect(fs.readFileSync(file).every((byte) => byte <= 0x7f)).toBe(true)
    expect(asTheLoaderReadsIt()('\u009b31mred\u001b[0m Â1m')).toBe('red Â1m')
  } finally {
    fs.rmSync(path.dirname(file), {recursive: true, force: true})
  }
})
