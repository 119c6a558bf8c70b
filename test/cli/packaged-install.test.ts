import {execa} from 'execa'
import fs from 'node:fs'
import os from 'node:os'
import path from 'node:path'
import {afterAll, beforeAll, describe, expect, it} from 'vitest'
import {ROOT} from '../helpers/home.js'

/**
 * What `npm install -g meepagateway` gives a user: the `npm pack` tarball unpacked into a global
 * prefix, its bin linked into PREFIX/bin, and only the production dependencies beside it (linked
 * from this checkout's node_modules: tests never reach a registry). No src/, no dev tools, no
 * plugins: every command, topic, --help and --json must work from the packed bundle and manifest.
 */
describe('the packed CLI, installed globally', () => {
  let prefix: string
  let bin: string
  let home: string
  const run = (args: string[], env: Record<string, string> = {}) =>
    execa(bin, args, {
      env: {PATH: `${path.join(prefix, 'bin')}:${process.env.PATH}`, MEEPAGATEWAY_HOME: home, ...env},
      extendEnv: false,
      reject: false,
      timeout: 60_000,
    })

  beforeAll(async () => {
    prefix = fs.mkdtempSync(path.join(os.tmpdir(), 'meepa-global-'))
    home = path.join(prefix, 'home')
    // dist/ is fresh (the test setup built it): pack without running the build again
    const {stdout} = await execa('npm', ['pack', '--ignore-scripts', '--json', '--pack-destination', prefix], {
      cwd: ROOT,
    })
    const [{filename}] = JSON.parse(stdout) as Array<{filename: string}>
    const pkg = path.join(prefix, 'lib', 'node_modules', 'meepagateway')
    fs.mkdirSync(pkg, {recursive: true})
    await execa('tar', ['-xzf', path.join(prefix, filename), '-C', pkg, '--strip-components=1'])
    const {stdout: production} = await execa('npm', ['ls', '--omit=dev', '--all', '--parseable'], {
      cwd: ROOT,
      reject: false,
    })
    for (const dir of production.split('\n').slice(1)) {
      const target = path.join(pkg, path.relative(ROOT, dir))
      if (fs.existsSync(target)) continue
      fs.mkdirSync(path.dirname(target), {recursive: true})
      fs.symlinkSync(dir, target)
    }
    fs.mkdirSync(path.join(prefix, 'bin'))
    bin = path.join(prefix, 'bin', 'meepagateway')
    fs.symlinkSync(path.join(pkg, 'bin', 'run.js'), bin)
  }, 120_000)
  afterAll(() => fs.rmSync(prefix, {recursive: true, force: true}))

  it('ships the bundle, its code cache and the manifest, not the sources or dev tools', () => {
    const pkg = path.join(prefix, 'lib', 'node_modules', 'meepagateway')
    for (const file of [
      'bin/run.js',
      'bin/cli-bundle.cjs',
      'dist/cli.cjs',
      'dist/cli.cjs.v8cache',
      'dist/agent-run.cjs',
      'dist/agent-run-providers.cjs',
      'oclif.manifest.json',
      'dist/native/meepa-sandbox',
    ]) {
      expect(fs.existsSync(path.join(pkg, file)), file).toBe(true)
    }
    expect(fs.existsSync(path.join(pkg, 'src'))).toBe(false)
    for (const devOnly of ['typescript', 'tsx', 'esbuild', 'oclif', 'vitest'])
      expect(fs.existsSync(path.join(pkg, 'node_modules', devOnly)), devOnly).toBe(false)
  })

  it('answers --help for every command and topic in the manifest', async () => {
    const manifest = JSON.parse(
      fs.readFileSync(path.join(prefix, 'lib', 'node_modules', 'meepagateway', 'oclif.manifest.json'), 'utf8'),
    ) as {commands: Record<string, {hidden?: boolean}>}
    const ids = Object.keys(manifest.commands)
    expect(ids).toEqual(
      expect.arrayContaining(['send', 'serve', 'config:check', 'sandbox:exec', 'container:status', 'help']),
    )
    const topics = [...new Set(ids.filter((id) => id.includes(':')).map((id) => id.split(':')[0] as string))]
    const root = await run(['--help'])
    expect(root.exitCode).toBe(0)
    for (const topic of topics) expect(root.stdout).toContain(topic)
    const results = await Promise.all(
      [...ids, ...topics].map(async (id) => ({id, result: await run([...id.split(':'), '--help'])})),
    )
    for (const {id, result} of results) {
      expect(result.exitCode, `${id} --help: ${result.stderr}`).toBe(0)
      expect(result.stdout, id).toContain('USAGE')
      // `help --help` is oclif's root help
      if (id !== 'help') expect(result.stdout, id).toContain(`meepagateway ${id.split(':').join(' ')}`)
    }
  })

  it('runs commands with --json and the documented exit codes', async () => {
    const check = await run(['config', 'check', '--json'])
    expect(check.exitCode, check.stderr).toBe(0)
    expect(JSON.parse(check.stdout).config.agents[0].id).toBe('meepa')
    const badFlag = await run(['config', 'check', '--json', '--nope'])
    expect(badFlag.exitCode).toBe(2)
    expect(JSON.parse(badFlag.stdout).error.code).toBe('E_USAGE')
    fs.writeFileSync(path.join(home, 'config.yaml'), 'providers: [')
    const badConfig = await run(['config', 'check', '--json'])
    expect(badConfig.exitCode).toBe(3)
    expect(JSON.parse(badConfig.stdout).error.code).toBe('E_CONFIG')
    const unknown = await run(['no-such-command'])
    expect(unknown.exitCode).not.toBe(0)
    expect(unknown.stderr).toContain('no-such-command')
    const version = await run(['--version'])
    expect(version.stdout).toMatch(/^meepagateway\/0\.1\.0 /)
  })

  it('has no plugin machinery: `plugins` is not a command', async () => {
    const result = await run(['plugins'])
    expect(result.exitCode).not.toBe(0)
    expect(`${result.stdout}${result.stderr}`).not.toMatch(/@oclif\/plugin/)
  })
})
