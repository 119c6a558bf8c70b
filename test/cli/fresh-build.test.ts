import {spawnSync} from 'node:child_process'
import {createHash} from 'node:crypto'
import fs from 'node:fs'
import {createRequire} from 'node:module'
import path from 'node:path'
import {describe, expect, it} from 'vitest'
import {BIN, makeHome, ROOT} from '../helpers/home.js'

const require = createRequire(import.meta.url)
const {CLI_FILES, commandIdOf, loadCliBundle} = require('../../bin/cli-bundle.cjs') as {
  CLI_FILES: Record<'bundle' | 'sources' | 'manifest', string>
  commandIdOf(file: string): string
  loadCliBundle(root: string): {
    exports: {COMMANDS: Record<string, {flags?: object; baseFlags?: object; enableJsonFlag?: boolean}>}
  }
}
const readJson = (file: string) => JSON.parse(fs.readFileSync(path.join(ROOT, file), 'utf8'))
const sha256 = (file: string) =>
  createHash('sha256')
    .update(fs.readFileSync(path.join(ROOT, file)))
    .digest('hex')

function commandSources(dir = path.join(ROOT, 'src', 'commands')): string[] {
  return fs.readdirSync(dir, {withFileTypes: true}).flatMap((entry) => {
    const file = path.join(dir, entry.name)
    if (entry.isDirectory()) return commandSources(file)
    return entry.name.endsWith('.ts') && entry.name !== 'base-command.ts'
      ? [path.relative(path.join(ROOT, 'src', 'commands'), file)]
      : []
  })
}

// What users and the end-to-end tests run is dist/cli.cjs plus oclif.manifest.json: a bundle, a
// manifest or a dist/ older than src/ would silently run (or describe) yesterday's code.
describe('the CLI that runs is built from the current sources', () => {
  it('the bundle was built from src/ as it is now (no source changed since)', () => {
    const sources = readJson(CLI_FILES.sources) as Record<string, string>
    expect(Object.keys(sources)).toContain('src/commands/send.ts')
    const changed = Object.entries(sources).filter(
      ([file, hash]) => !fs.existsSync(path.join(ROOT, file)) || sha256(file) !== hash,
    )
    expect(changed.map(([file]) => file)).toEqual([])
  })

  it('the manifest lists exactly the commands in src/commands, with the flags the bundled classes declare', () => {
    const manifest = readJson(CLI_FILES.manifest) as {version: string; commands: Record<string, {flags: object}>}
    expect(manifest.version).toBe(readJson('package.json').version)
    const ids = commandSources().map((file) => commandIdOf(file.replace(/\.ts$/, '.js')))
    expect(Object.keys(manifest.commands).sort()).toEqual([...ids, 'help'].sort())
    const {COMMANDS} = loadCliBundle(ROOT).exports
    for (const id of ids) {
      const command = COMMANDS[id]
      const declared = [
        ...Object.keys(command?.baseFlags ?? {}),
        ...Object.keys(command?.flags ?? {}),
        ...(command?.enableJsonFlag ? ['json'] : []),
      ]
      expect(Object.keys(manifest.commands[id]?.flags ?? {}).sort(), id).toEqual([...new Set(declared)].sort())
    }
  })

  it("tests that run commands in-process (@oclif/test's runCommand) get them from the bundle too", async () => {
    const {Config} = await import('@oclif/core')
    const config = await Config.load(ROOT)
    const loaded = await config.findCommand('send', {must: true}).load()
    const bundled = (require(path.join(ROOT, CLI_FILES.bundle)) as {COMMANDS: Record<string, unknown>}).COMMANDS.send
    expect(loaded).toBe(bundled)
  })

  it('bin/run.js runs the bundles, not src/ through a TypeScript loader, also under NODE_ENV=test', () => {
    const home = makeHome()
    try {
      const probe = path.join(home.home, 'probe.cjs')
      // prints every CommonJS module the process loaded (the bundles register themselves there)
      fs.writeFileSync(
        probe,
        "process.on('exit', () => process.stderr.write('LOADED ' + JSON.stringify(Object.keys(require.cache)) + '\\n'))\n",
      )
      // agent list runs from its lite bundle, config schema through oclif and the full bundle
      for (const [argv, bundle] of [
        [['agent', 'list', '--json'], 'dist/lite/agent-list.cjs'],
        [['config', 'schema'], CLI_FILES.bundle],
      ] as const) {
        const result = spawnSync(process.execPath, ['--require', probe, BIN, ...argv], {
          env: {...process.env, NODE_ENV: 'test', MEEPAGATEWAY_HOME: home.home},
          encoding: 'utf8',
        })
        expect(result.status, result.stderr).toBe(0)
        expect(JSON.parse(result.stdout)).toBeInstanceOf(Object)
        const loaded = JSON.parse(/^LOADED (.*)$/m.exec(result.stderr)?.[1] ?? '[]') as string[]
        expect(loaded).toContain(path.join(ROOT, bundle))
        expect(
          loaded.filter((file) => file.startsWith(path.join(ROOT, 'src')) || /[\\/](tsx|typescript)[\\/]/.test(file)),
        ).toEqual([])
        expect(result.stderr).not.toMatch(/warn/i)
      }
    } finally {
      home.cleanup()
    }
  })
})
