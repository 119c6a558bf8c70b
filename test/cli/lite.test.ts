import {execa} from 'execa'
import fs from 'node:fs'
import http from 'node:http'
import path from 'node:path'
import {afterAll, beforeAll, describe, expect, it} from 'vitest'
import {LITE_COMMANDS} from '../../src/cli/lite/commands.js'
import {parseArgv} from '../../src/cli/lite/parse.js'
import {Flags, Args} from '../../src/cli/lite/core.js'
import {RunRecords} from '../../src/runtime/state/run-records.js'
import {withGatewayDb} from '../../src/runtime/state/gateway-db.js'
import {BIN, makeHome, ROOT, type TestHome} from '../helpers/home.js'

// The lite bundles (src/cli/lite/, dist/lite/) run the most used commands without oclif. Each
// case runs the same argv through bin/run.js and through oclif over the full bundle, and the
// two must print the same bytes and exit alike; a probe says which path ran.

const PROBE =
  "process.on('exit', () => require('node:fs').writeSync(2, '\\nFULL_CLI ' + Object.keys(require('node:module')._cache).some((file) => file.endsWith('/dist/cli.cjs')) + '\\n'))\n"
// a file, not -e: oclif reads the command line from process.argv.slice(2) when it shows help for an error
const VIA_OCLIF = `const {loadCliBundle} = require(${JSON.stringify(path.join(ROOT, 'bin', 'cli-bundle.cjs'))}); const core = loadCliBundle(${JSON.stringify(ROOT)}).exports.core(); core.settings.enableAutoTranspile = false; core.execute({loadOptions: {root: ${JSON.stringify(ROOT)}, userPlugins: false, devPlugins: false}})`

interface Ran {
  exitCode: number
  stdout: string
  stderr: string
  fullCli: boolean
}

let home: TestHome
let probe: string
let viaOclifScript: string

async function run(prefix: string[], argv: string[], env: Record<string, string> = {}): Promise<Ran> {
  const result = await execa(process.execPath, ['--require', probe, ...prefix, ...argv], {
    env: {PATH: process.env.PATH ?? '', MEEPAGATEWAY_HOME: home.home, ...env},
    extendEnv: false,
    reject: false,
    stdin: 'ignore',
  })
  const stderr = String(result.stderr)
  return {
    exitCode: result.exitCode ?? -1,
    stdout: String(result.stdout),
    stderr: stderr.replace(/\n?FULL_CLI \w+\n?$/, ''),
    fullCli: /FULL_CLI true/.test(stderr),
  }
}
const viaBin = (argv: string[], env?: Record<string, string>) => run([BIN], argv, env)
const viaOclif = (argv: string[], env?: Record<string, string>) => run([viaOclifScript], argv, env)

/**
 * Both ways; the lite path must not have loaded the full CLI when `lite` is expected. `normalize`
 * evens out what differs per run (a temp dir's name).
 */
async function expectSame(
  argv: string[],
  options: {lite: boolean; env?: Record<string, string>; normalize?: (text: string) => string},
): Promise<Ran> {
  const [bin, oclif] = [await viaBin(argv, options.env), await viaOclif(argv, options.env)]
  expect(oclif.fullCli).toBe(true)
  expect(bin.fullCli, `${argv.join(' ')}: full CLI loaded`).toBe(!options.lite)
  const seen = ({exitCode, stdout, stderr}: Ran) => ({
    exitCode,
    stdout: options.normalize?.(stdout) ?? stdout,
    stderr: options.normalize?.(stderr) ?? stderr,
  })
  expect(seen(bin), argv.join(' ')).toEqual(seen(oclif))
  return bin
}

/** A fixed Docker engine on a unix socket (a container and an image left behind), so both runs see the same state. */
async function withFakeEngine(body: (env: Record<string, string>) => Promise<void>): Promise<void> {
  const engine = http.createServer((req, res) => {
    const url = req.url ?? ''
    if (url === '/_ping')
      return res.writeHead(200, {'API-Version': '1.41', Server: 'Docker/20.10.24 (linux)'}).end('OK')
    if (url.startsWith('/containers/json')) return res.writeHead(200).end(JSON.stringify([{Id: 'left'}]))
    if (url === '/containers/left/json') {
      return res.writeHead(200).end(
        JSON.stringify({
          Id: 'left',
          Name: '/meepa-left',
          Created: '2026-01-01T00:00:00Z',
          Image: 'sha256:other',
          State: {Status: 'exited', Running: false},
          Config: {
            Image: 'meepa-sandbox:0123456789abcdef',
            Labels: {meepagateway: '1', 'meepagateway.agent': 'contained', 'meepagateway.pid': '999999999'},
          },
        }),
      )
    }
    if (url.startsWith('/images/json'))
      return res.writeHead(200).end(JSON.stringify([{Id: `sha256:${'a'.repeat(64)}`}]))
    if (url === `/images/sha256:${'a'.repeat(64)}/json`) {
      return res.writeHead(200).end(
        JSON.stringify({
          Id: `sha256:${'a'.repeat(64)}`,
          RepoTags: ['meepa-sandbox:0123456789abcdef'],
          Size: 5_000_000,
          Created: '2020-01-01T00:00:00Z',
          Config: {Labels: {meepagateway: '1', 'meepagateway.kind': 'container'}},
        }),
      )
    }
    res.writeHead(404).end(JSON.stringify({message: 'not here'}))
  })
  const socket = path.join(home.home, 'engine.sock')
  await new Promise<void>((resolve) => engine.listen(socket, resolve))
  try {
    await body({DOCKER_HOST: `unix://${socket}`})
  } finally {
    engine.closeAllConnections()
    await new Promise((resolve) => engine.close(resolve))
  }
}

beforeAll(() => {
  home = makeHome({
    providers: {primary: 'p', providers: {p: {kind: 'openai', api_key_env: 'LITE_TEST_KEY', model: 'm'}}},
    agents: [
      {id: 'boxed'},
      {id: 'free', file_access: {unrestricted: true}},
      {id: 'contained', container_mode: {enabled: true, network: 'none'}},
    ],
  })
  probe = path.join(home.home, 'probe.cjs')
  fs.writeFileSync(probe, PROBE)
  viaOclifScript = path.join(home.home, 'via-oclif.cjs')
  fs.writeFileSync(viaOclifScript, VIA_OCLIF)
  fs.mkdirSync(home.workspace('boxed'), {recursive: true})
  withGatewayDb(home.home, (db) => {
    const records = new RunRecords(db)
    records.start({
      id: 'run-1',
      agentId: 'boxed',
      connector: 'cli',
      channelId: 'cli',
      isolation: 'host-sandbox',
      startedAt: Date.UTC(2026, 0, 2, 3, 4, 5),
    })
    records.finish(
      'run-1',
      {
        version: 1,
        ok: true,
        run_id: 'run-1',
        reply: {content: 'hi'},
        usage: {input_tokens: 12, output_tokens: 34},
        iterations: 1,
        tool_calls: [],
      } as never,
      {durationMs: 1234},
    )
    records.reject(
      {
        id: 'run-2',
        agentId: 'free',
        connector: 'api',
        channelId: 'api-1/x',
        isolation: 'unrestricted',
        startedAt: Date.UTC(2026, 0, 2, 3, 4, 6),
      },
      'E_QUEUE_FULL',
      'the queue is full\nsecond line',
    )
  })
})
afterAll(() => home.cleanup())

describe('commands without oclif print what oclif prints (bin/run.js against oclif over dist/cli.cjs)', () => {
  it('agent list, plain and --json, and with --config', async () => {
    await expectSame(['agent', 'list'], {lite: true})
    await expectSame(['agent', 'list', '--json'], {lite: true})
    await expectSame(['agent', 'list', `--config=${home.configPath}`], {lite: true})
    await expectSame(['agent', 'list', '--json'], {lite: true, env: {MEEPAGATEWAY_CONTENT_TYPE: 'json'}})
  })

  it('runs: the table, --json, -n and --agent', async () => {
    const table = await expectSame(['runs'], {lite: true})
    expect(table.stdout).toContain('E_QUEUE_FULL: the queue is full')
    await expectSame(['runs', '--json'], {lite: true})
    await expectSame(['runs', '-n', '1', '--agent', 'free'], {lite: true})
    await expectSame(['runs', '--agent=nobody'], {lite: true})
  })

  it('config check, and its errors with their codes and suggestions', async () => {
    await expectSame(['config', 'check'], {lite: true})
    await expectSame(['config', 'check', '--json'], {lite: true})
    const missing = await expectSame(['config', 'check', '--config', path.join(home.home, 'nope.yaml')], {lite: true})
    expect(missing.exitCode).not.toBe(0)
    expect(missing.stderr).toContain('config file not found')
    const broken = path.join(home.home, 'broken.yaml')
    fs.writeFileSync(broken, 'agents:\n  - id: 7\n    max_iterations: -1\nproviders: [\n')
    await expectSame(['config', 'check', '--config', broken], {lite: true})
    fs.writeFileSync(broken, 'agents:\n  - id: "bad id"\n    max_iterations: -1\n')
    const invalid = await expectSame(['config', 'check', '--config', broken, '--json'], {lite: true})
    expect(JSON.parse(invalid.stdout).error.code).toBe('E_CONFIG')
  })

  it('container status, images and clean against an engine that is not there: exit 10 the same way', async () => {
    const missingSocket = `unix://${path.join(home.home, 'no-engine.sock')}`
    for (const command of [
      ['container', 'status'],
      ['container', 'images'],
      ['container', 'clean', '--dry-run'],
      ['container', 'clean', '--all'],
    ]) {
      const down = await expectSame(command, {lite: true, env: {DOCKER_HOST: missingSocket}})
      expect(down.exitCode, command.join(' ')).toBe(10)
      await expectSame([...command, '--json'], {lite: true, env: {DOCKER_HOST: missingSocket}})
    }
  })

  it('container clean --dry-run against an engine with a container and an image left behind: the same both ways', async () => {
    await withFakeEngine(async (env) => {
      const text = await expectSame(['container', 'clean', '--dry-run'], {lite: true, env})
      expect(text.stdout).toContain('would remove container meepa-left')
      const dry = JSON.parse(
        (await expectSame(['container', 'clean', '--dry-run', '--json'], {lite: true, env})).stdout,
      )
      expect(dry).toMatchObject({
        dry_run: true,
        containers: [{name: 'meepa-left'}],
        images: [{ref: 'meepa-sandbox:0123456789abcdef'}],
        kept_containers: [],
      })
    })
  })

  it('agent create, audit, api-key list and sandbox explain, plain and --json, and their errors', async () => {
    await viaBin(['agent', 'create', 'boxed'])
    await expectSame(['agent', 'create', 'boxed'], {lite: true}) // there now: both keep it
    await expectSame(['agent', 'create', 'boxed', '--json'], {lite: true})
    const invalid = await expectSame(['agent', 'create', 'Not_An_Id'], {lite: true})
    expect(invalid.exitCode).not.toBe(0)
    await expectSame(['audit'], {lite: true})
    await expectSame(['audit', '--json', '-n', '1', '--since', '24h'], {lite: true})
    await expectSame(['audit', '--since', 'yesterday-ish'], {lite: true})
    await expectSame(['api-key', 'list'], {lite: true})
    await expectSame(['api-key', 'list', '--json'], {lite: true})
    // each explain names its own private TMPDIR
    const tmpDir = (text: string) => text.replace(/meepa-sandbox-boxed-\w+/g, 'meepa-sandbox-boxed-X')
    await expectSame(['sandbox', 'explain', '--agent', 'boxed'], {lite: true, normalize: tmpDir})
    await expectSame(['sandbox', 'explain', '--agent', 'boxed', '--json'], {lite: true, normalize: tmpDir})
    await expectSame(['sandbox', 'explain', '--agent', 'nobody', '--json'], {lite: true})
    await expectSame(['sandbox', 'explain'], {lite: false}) // a required flag missing: oclif's message
  })

  it('a first run writes the default config and says so, the same way', async () => {
    const fresh = makeHome()
    try {
      const bin = await run([BIN], ['agent', 'list'], {MEEPAGATEWAY_HOME: fresh.home})
      fs.rmSync(fresh.configPath)
      const again = await run([viaOclifScript], ['agent', 'list'], {MEEPAGATEWAY_HOME: fresh.home})
      expect(bin.fullCli).toBe(false)
      expect(bin.stderr).toContain('Created a default config')
      expect({exitCode: bin.exitCode, stdout: bin.stdout, stderr: bin.stderr}).toEqual({
        exitCode: again.exitCode,
        stdout: again.stdout,
        stderr: again.stderr,
      })
    } finally {
      fresh.cleanup()
    }
  })

  it('leaves what it is not sure of to oclif: unknown, repeated or malformed flags, extra args, help, debug', async () => {
    for (const argv of [
      ['agent', 'list', '--bogus'],
      ['agent', 'list', 'extra'],
      ['runs', '--limit', '0'],
      ['runs', '--limit', 'x'],
      ['runs', '-n', '5', '-n', '6'],
      ['runs', '--agent'],
      ['runs', '-n5'],
      ['runs', '--json=yes'],
      ['runs', '--agent=--json'],
      ['runs', '--agent=-n5'],
      ['agent', 'list', '--config=--json'],
      ['runs', '--agent=-x'],
      ['config', 'check', '--'],
      ['agent:list'],
      ['help', 'runs'],
    ]) {
      await expectSame(argv, {lite: false})
    }
    await expectSame(['agent', 'list'], {lite: false, env: {MEEPAGATEWAY_DEBUG: '1'}})
    // Node's own warning that FORCE_COLOR overrides NO_COLOR comes with process.stdout, which only oclif creates
    const pid = (text: string) => text.replace(/\(node:\d+\)/g, '(node:PID)')
    await expectSame(['audit'], {lite: false, env: {FORCE_COLOR: '1', NO_COLOR: '1'}, normalize: pid})
    // colour off: no warning (vitest's own setting)
    await expectSame(['audit'], {lite: true, env: {FORCE_COLOR: '0', NO_COLOR: '1'}})
    await expectSame(['api-key', 'list', '--json'], {
      lite: false,
      env: {FORCE_COLOR: '1', NODE_DISABLE_COLORS: '1'},
      normalize: pid,
    })
  })

  it('leaves JSON output to oclif when a user theme colours it (CONFIG_DIR/theme.json)', async () => {
    const configHome = path.join(home.home, 'xdg')
    fs.mkdirSync(path.join(configHome, 'meepagateway'), {recursive: true})
    fs.writeFileSync(
      path.join(configHome, 'meepagateway', 'theme.json'),
      JSON.stringify({json: {key: 'red', string: 'green', brace: 'blue'}}),
    )
    try {
      const colored = await expectSame(['agent', 'list', '--json'], {
        lite: false,
        env: {XDG_CONFIG_HOME: configHome, FORCE_COLOR: '1'},
      })
      expect(colored.stdout).toContain('\u001B[')
      await expectSame(['runs', '--json'], {
        lite: false,
        env: {MEEPAGATEWAY_CONFIG_DIR: path.join(configHome, 'meepagateway'), FORCE_COLOR: '1'},
      })
      await expectSame(['agent', 'list', '--json'], {
        lite: true,
        env: {XDG_CONFIG_HOME: configHome, FORCE_COLOR: '1', MEEPAGATEWAY_DISABLE_THEME: 'true'},
      })
    } finally {
      fs.rmSync(configHome, {recursive: true, force: true})
    }
  })

  it('leaves a run from a directory that no longer exists to oclif (it warns as it loads)', async () => {
    for (const argv of [['agent', 'list'], ['--help'], ['sandbox', 'exec', '--agent', 'boxed', '--', 'true']]) {
      const ran = await Promise.all(
        [[BIN], [viaOclifScript]].map(async (prefix) => {
          const gone = fs.mkdtempSync(path.join(home.home, 'gone-'))
          const quoted = ['--require', probe, ...prefix, ...argv].map((word) => `'${word}'`).join(' ')
          const result = await execa(
            'sh',
            ['-c', `cd '${gone}' && rmdir '${gone}' && exec '${process.execPath}' ${quoted}`],
            {
              env: {PATH: process.env.PATH ?? '', MEEPAGATEWAY_HOME: home.home},
              extendEnv: false,
              reject: false,
              stdin: 'ignore',
            },
          )
          return {
            exitCode: result.exitCode,
            stdout: String(result.stdout),
            stderr: String(result.stderr).replace(/\n?FULL_CLI \w+\n?$/, ''),
          }
        }),
      )
      expect(ran[1]?.stderr, argv.join(' ')).toContain('WARNING: current directory does not exist')
      expect(ran[0], argv.join(' ')).toEqual(ran[1])
    }
  })
})

describe('colour in human-readable output (chalk, src/cli/colour.ts), the same both ways', () => {
  const ESC = '\u001B['
  const green = (text: string) => `${ESC}32m${text}${ESC}39m`
  const red = (text: string) => `${ESC}31m${text}${ESC}39m`
  const tmpDir = (text: string) => text.replace(/meepa-sandbox-boxed-\w+/g, 'meepa-sandbox-boxed-X')
  const explain = ['sandbox', 'explain', '--agent', 'boxed']

  it('sandbox explain with FORCE_COLOR=1: allowed paths green, denied paths red, nothing else coloured', async () => {
    const shown = await expectSame(explain, {lite: true, env: {FORCE_COLOR: '1'}, normalize: tmpDir})
    const plain = await expectSame(explain, {lite: true, normalize: tmpDir})
    expect(shown.stdout).toContain(`${ESC}1m${green('allowed')}${ESC}22m (Landlock path rules`)
    expect(shown.stdout).toContain(`${ESC}1m${red('denied')}${ESC}22m (nothing else`)
    expect(shown.stdout).toContain(`  ${green(home.workspace('boxed'))}\n`)
    expect(shown.stdout).toContain(`  ${red(path.join(home.home, 'config.yaml'))}`)
    // the same text once the colour is taken out
    expect(tmpDir(shown.stdout).replace(new RegExp(`${String.fromCharCode(27)}\\[\\d+m`, 'g'), '')).toBe(
      tmpDir(plain.stdout),
    )
  })

  it('no colour for a pipe, NO_COLOR, --no-color, FORCE_COLOR=0, or --json even when forced', async () => {
    for (const [argv, env] of [
      [explain, {}],
      [explain, {NO_COLOR: '1'}],
      [[...explain, '--no-color'], {FORCE_COLOR: '1'}],
      [explain, {FORCE_COLOR: '0'}],
      [[...explain, '--json'], {FORCE_COLOR: '1'}],
      [['config', 'check', '--config', path.join(home.home, 'nope.yaml'), '--json'], {FORCE_COLOR: '1'}],
    ] as Array<[string[], Record<string, string>]>) {
      const shown = await expectSame(argv, {lite: true, env, normalize: tmpDir})
      expect(`${shown.stdout}${shown.stderr}`, `${argv.join(' ')} ${JSON.stringify(env)}`).not.toContain(ESC)
    }
  })

  it('an error with FORCE_COLOR=1: its marker and "Error" in red on stderr; none with NO_COLOR or --no-color', async () => {
    const missing = ['config', 'check', '--config', path.join(home.home, 'nope.yaml')]
    const shown = await expectSame(missing, {lite: true, env: {FORCE_COLOR: '1'}})
    expect(shown.stderr).toContain(` ${red('›')}   ${ESC}1m${red('Error')}${ESC}22m: config file not found`)
    expect(shown.stdout).toBe('')
    for (const [argv, env] of [
      [missing, {NO_COLOR: '1'}],
      [[...missing, '--no-color'], {FORCE_COLOR: '1'}],
    ] as Array<[string[], Record<string, string>]>) {
      expect((await expectSame(argv, {lite: true, env})).stderr).not.toContain(ESC)
    }
  })

  it('container status with FORCE_COLOR=1: the engine that is up in green, a container that is not running in yellow', async () => {
    await withFakeEngine(async (env) => {
      const shown = await expectSame(['container', 'status'], {lite: true, env: {...env, FORCE_COLOR: '1'}})
      expect(shown.stdout).toContain(`engine: ${green('Docker 20.10.24 (API 1.41)')}`)
      expect(shown.stdout).toContain(`meepa-left ${ESC}33mexited${ESC}39m agent=contained`)
      const json = await expectSame(['container', 'status', '--json'], {lite: true, env: {...env, FORCE_COLOR: '1'}})
      expect(json.stdout).not.toContain(ESC)
    })
  })

  it('colour at a terminal (a pseudo-terminal from script(1)), none when its output is piped on', async () => {
    const atTerminal = (command: string) =>
      execa('script', ['-qec', command, '/dev/null'], {
        env: {PATH: process.env.PATH ?? '', MEEPAGATEWAY_HOME: home.home, TERM: 'xterm'},
        extendEnv: false,
        reject: false,
        stdin: 'ignore',
      })
    const command = `"${process.execPath}" "${BIN}" sandbox explain --agent boxed`
    expect(String((await atTerminal(command)).stdout)).toContain(green(home.workspace('boxed')))
    expect(String((await atTerminal(`${command} | cat`)).stdout)).not.toContain(ESC)
    // NO_COLOR at a terminal, for output and for an error (whose marker oclif would colour, asking supports-color)
    expect(String((await atTerminal(`NO_COLOR=1 ${command}`)).stdout)).not.toContain(ESC)
    const error = String(
      (
        await atTerminal(
          `NO_COLOR=1 "${process.execPath}" "${BIN}" config check --config '${path.join(home.home, 'nope.yaml')}'`,
        )
      ).stdout,
    )
    expect(error).toContain('Error: config file not found')
    expect(error).not.toContain(ESC)
    expect(
      String(
        (
          await atTerminal(
            `"${process.execPath}" "${BIN}" config check --config '${path.join(home.home, 'nope.yaml')}'`,
          )
        ).stdout,
      ),
    ).toContain(red('›'))
  })
})

describe('help pages without oclif', () => {
  const pages = () =>
    JSON.parse(fs.readFileSync(path.join(ROOT, 'dist', 'lite', 'help-pages.json'), 'utf8')) as {
      pages: Record<string, string>
    }

  it('has a page for the root, every topic and every command, each what oclif prints', async () => {
    const manifest = JSON.parse(fs.readFileSync(path.join(ROOT, 'oclif.manifest.json'), 'utf8')) as {
      commands: Record<string, unknown>
    }
    const forms = Object.keys(pages().pages)
    for (const id of Object.keys(manifest.commands)) expect(forms).toContain(`${id.split(':').join(' ')} --help`)
    expect(forms).toEqual(expect.arrayContaining(['', '--help', 'agent', 'agent --help', 'container --help']))
    for (const form of [
      '',
      '--help',
      'agent',
      'runs --help',
      'send --help',
      'container status --help',
      'sandbox exec --help',
    ]) {
      const argv = form === '' ? [] : form.split(' ')
      const shown = await expectSame(argv, {lite: true})
      expect(shown.stdout).toContain('USAGE')
    }
  })

  it('leaves colour and other widths to oclif', async () => {
    await expectSame(['--help'], {lite: false, env: {OCLIF_COLUMNS: '120'}})
    await expectSame(['runs', '--help'], {lite: false, env: {FORCE_COLOR: '1'}})
  })

  it('prints the platform as oclif names it: wsl under WSL (is-wsl, which __IS_WSL_TEST__ turns on)', async () => {
    const shown = await expectSame(['--help'], {lite: true, env: {__IS_WSL_TEST__: '1'}})
    expect(shown.stdout).toContain(' wsl-')
  })

  it('prints the running Node version, not the one of the build', async () => {
    const shown = await viaBin(['--help'])
    expect(shown.stdout).toContain(`node-${process.version}`)
  })
})

describe('the lite parser (src/cli/lite/parse.ts)', () => {
  const input = {
    flags: {
      json: Flags.boolean(),
      agent: Flags.string({char: 'a'}),
      limit: Flags.integer({char: 'n', default: 20, min: 1, max: 100}),
      channel: Flags.string({default: 'cli'}),
    },
    args: {message: Args.string({required: true})},
    strict: true,
  }

  it('gives what oclif gives for plain argv: values, defaults, chars, --name=value, a lone "-" as an argument', () => {
    expect(parseArgv(['-a', 'x', 'hello'], input)).toEqual({
      flags: {agent: 'x', limit: 20, channel: 'cli'},
      args: {message: 'hello'},
    })
    expect(parseArgv(['--limit=5', '--json', '-', '--agent', 'y'], input)).toEqual({
      flags: {limit: 5, json: true, agent: 'y', channel: 'cli'},
      args: {message: '-'},
    })
  })

  it('defers everything else', () => {
    for (const argv of [
      [],
      ['m', 'extra'],
      ['--limit', '0', 'm'],
      ['--limit', '101', 'm'],
      ['--limit', '1.5', 'm'],
      ['-a', '-b', 'm'],
      ['--agent=', 'm'],
      ['--agent=--json', 'm'],
      ['--agent=-n5', 'm'],
      ['--limit=-1', 'm'],
      ['--json=true', 'm'],
      ['-ax', 'm'],
      ['--', 'm'],
      ['--help'],
      ['m', '--agent', 'a', '--agent', 'b'],
    ]) {
      expect(() => parseArgv(argv, input), argv.join(' ')).toThrow(/left to oclif/)
    }
    expect(() => parseArgv(['m'], {...input, strict: false})).toThrow(/left to oclif/)
    expect(() =>
      parseArgv(['m'], {...input, flags: {...input.flags, tags: {...Flags.string(), multiple: true} as never}}),
    ).toThrow(/left to oclif/)
  })

  it('names only commands that exist', () => {
    const manifest = JSON.parse(fs.readFileSync(path.join(ROOT, 'oclif.manifest.json'), 'utf8')) as {
      commands: Record<string, unknown>
    }
    for (const id of LITE_COMMANDS) expect(Object.keys(manifest.commands)).toContain(id)
  })
})

describe('output to a reader that goes away', () => {
  it('ends quietly when the pipe closes early (| head)', async () => {
    const result = await execa('sh', ['-c', `"${process.execPath}" "${BIN}" runs --json | head -c 1`], {
      env: {PATH: process.env.PATH ?? '', MEEPAGATEWAY_HOME: home.home},
      extendEnv: false,
      reject: false,
    })
    expect(result.stdout).toBe('[')
    expect(String(result.stderr)).toBe('')
  })
})
