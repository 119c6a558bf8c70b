import {execa} from 'execa'
import fs from 'node:fs'
import os from 'node:os'
import path from 'node:path'
import {afterEach, beforeEach, describe, expect, it} from 'vitest'
import {parseSandboxExecArgv, SANDBOX_EXEC_FLAGS} from '../../src/cli/fast-paths.js'
import {BIN, makeHome, ROOT, type TestHome} from '../helpers/home.js'
import {requireLandlockOrSkip} from '../helpers/landlock-support.js'

describe('sandbox exec argv the fast path takes (src/cli/fast-paths.ts)', () => {
  it('takes plain flags, then `--`, then the command exactly as typed', () => {
    expect(parseSandboxExecArgv(['--agent', 'a', '--', 'ls', '-la', '--', 'x y'])).toEqual({
      agent: 'a',
      timeoutSeconds: 3600,
      command: ['ls', '-la', '--', 'x y'],
    })
    expect(parseSandboxExecArgv(['-a', 'a', '--timeout=5', '--config', '/c.yaml', '--', 'true'])).toEqual({
      agent: 'a',
      timeoutSeconds: 5,
      config: '/c.yaml',
      command: ['true'],
    })
    expect(parseSandboxExecArgv(['-aa', '--timeout', '7', '--', 'true'])).toEqual({
      agent: 'a',
      timeoutSeconds: 7,
      command: ['true'],
    })
    expect(parseSandboxExecArgv(['--no-color', '-a', 'a', '--', 'true'])).toEqual({
      agent: 'a',
      timeoutSeconds: 3600,
      noColor: true,
      command: ['true'],
    })
  })

  it('leaves everything else to oclif: help, unknown, repeated or malformed flags, no command', () => {
    for (const argv of [
      ['--help'],
      ['--agent', 'a', '--help', '--', 'true'],
      ['-h', '--', 'true'],
      ['--agent', 'a', '--json', '--', 'true'],
      ['--agent', 'a', '--agent', 'b', '--', 'true'],
      ['--agent', 'a', '--no-color', '--no-color', '--', 'true'],
      ['--agent', 'a', '--no-color=true', '--', 'true'],
      ['--agent', '--', 'true'],
      ['--agent', 'a', '--timeout', '0', '--', 'true'],
      ['--agent', 'a', '--timeout', '1.5', '--', 'true'],
      ['--agent', 'a', '--timeout', 'x', '--', 'true'],
      ['-a=a', '--', 'true'],
      ['--agent', 'a', 'true'],
      ['--agent', 'a', '--'],
      ['--', 'true'],
      ['stray', '--agent', 'a', '--', 'true'],
    ]) {
      expect(parseSandboxExecArgv(argv), argv.join(' ')).toBeUndefined()
    }
  })

  it('knows exactly the flags the oclif command declares', () => {
    const manifest = JSON.parse(fs.readFileSync(path.join(ROOT, 'oclif.manifest.json'), 'utf8')) as {
      commands: Record<string, {flags: Record<string, {char?: string; type: string}>}>
    }
    const declared = manifest.commands['sandbox:exec']?.flags ?? {}
    expect(Object.keys(SANDBOX_EXEC_FLAGS).sort()).toEqual(Object.keys(declared).sort())
    for (const [name, flag] of Object.entries(SANDBOX_EXEC_FLAGS)) {
      expect(declared[name]?.char, name).toBe('char' in flag ? flag.char : undefined)
      expect(declared[name]?.type, name).toBe(flag.type === 'boolean' ? 'boolean' : 'option')
    }
  })
})

const landlock = requireLandlockOrSkip('sandbox exec fast path tests')

describe.skipIf(!landlock)('sandbox exec through bin/run.js: the fast path and oclif agree', () => {
  let home: TestHome
  beforeEach(() => {
    // lenient: best effort, the only way a run goes without the namespace layer (file metadata is unprotected there)
    home = makeHome({
      providers: {primary: 'p', providers: {p: {kind: 'openai', model: 'm'}}},
      agents: [{id: 'meepa'}, {id: 'lenient', file_access: {best_effort: true}}],
    })
  })
  afterEach(() => home.cleanup())

  // --require probe: was oclif ever evaluated in this process? (@oclif/core sets globalThis.oclif)
  const run = async (argv: string[], env: Record<string, string> = {}) => {
    const probe = path.join(home.home, 'probe.cjs')
    fs.writeFileSync(
      probe,
      "process.on('exit', () => process.stderr.write('\\nOCLIF ' + (typeof globalThis.oclif) + '\\n'))\n",
    )
    const result = await execa(process.execPath, ['--require', probe, ...argv], {
      env: {MEEPAGATEWAY_HOME: home.home, ...env},
      reject: false,
    })
    return {
      exitCode: result.exitCode,
      stdout: String(result.stdout),
      stderr: String(result.stderr).replace(/\nOCLIF \w+\n?$/, ''),
      oclif: /OCLIF object/.test(String(result.stderr)),
    }
  }
  const exec = (args: string[], env?: Record<string, string>) => run([BIN, 'sandbox', 'exec', ...args], env)
  /** The same argv through oclif and the shipped bundle, skipping bin/run.js's fast path. */
  const execViaOclif = (args: string[], env?: Record<string, string>) =>
    run(
      [
        '-e',
        `const {loadCliBundle} = require(${JSON.stringify(path.join(ROOT, 'bin', 'cli-bundle.cjs'))}); const core = loadCliBundle(${JSON.stringify(ROOT)}).exports.core(); core.settings.enableAutoTranspile = false; core.execute({args: process.argv.slice(1), loadOptions: {root: ${JSON.stringify(ROOT)}}})`,
        'sandbox',
        'exec',
        ...args,
      ],
      env,
    )

  it('passes the command through untouched and its exit status back, without loading oclif', async () => {
    const script = 'printf "%s|" "$@"; exit 7'
    const fast = await exec(['--agent', 'meepa', '--', 'sh', '-c', script, 'sh', 'a b', '--', '-x'])
    expect(fast).toMatchObject({exitCode: 7, stdout: 'a b|--|-x|', oclif: false})
    // oclif's own path gives the same (argv without dashes: oclif 4 reorders and dedupes those of non-strict commands)
    for (const plain of [['printf', '%s|', 'a b', 'c', 'c'], ['false']]) {
      const argv = ['--agent', 'meepa', '--', ...plain]
      const [fastPlain, viaOclif] = await Promise.all([exec(argv), execViaOclif(argv)])
      expect(fastPlain.oclif).toBe(false)
      expect(viaOclif.oclif).toBe(true)
      expect({exitCode: viaOclif.exitCode, stdout: viaOclif.stdout}).toEqual({
        exitCode: fastPlain.exitCode,
        stdout: fastPlain.stdout,
      })
    }
    expect((await exec(['--agent', 'meepa', '--', 'printf', '%s|', 'a b'])).stdout).toBe('a b|')
  })

  it('enforces the agent policy on the fast path (a write outside the workspace fails)', async () => {
    const outside = path.join(home.home, 'outside.txt')
    const result = await exec(['--agent', 'meepa', '--', 'sh', '-c', `echo pwned > ${outside}`])
    expect(result.oclif).toBe(false)
    expect(result.exitCode).not.toBe(0)
    expect(fs.existsSync(outside)).toBe(false)
  })

  it('kills the command at --timeout with exit 124 and says so', async () => {
    const result = await exec(['--agent', 'meepa', '--timeout', '1', '--', 'sleep', '30'])
    expect(result).toMatchObject({exitCode: 124, oclif: false})
    expect(result.stderr).toContain('ran longer than 1 s and was killed')
  })

  it('leaves nothing of the command running when it returns: not what it put in the background, with or without the namespace layer', async () => {
    const running = (token: string) =>
      fs
        .readdirSync('/proc')
        .filter((entry) => /^\d+$/.test(entry))
        .some((pid) => {
          try {
            return fs.readFileSync(`/proc/${pid}/cmdline`, 'utf8').split('\0').includes(token)
          } catch {
            return false
          }
        })
    for (const namespaces of [true, false]) {
      // a sleep that no other process on the machine has, started in the background (nohup: not even SIGHUP reaches it)
      const token = String(3_000_000 + Math.floor(Math.random() * 1_000_000))
      const result = await execa(
        process.execPath,
        [
          BIN,
          'sandbox',
          'exec',
          '--agent',
          namespaces ? 'meepa' : 'lenient',
          '--',
          'sh',
          '-c',
          `nohup sleep ${token} >/dev/null 2>&1 & sleep 0.2; echo started`,
        ],
        {
          env: {MEEPAGATEWAY_HOME: home.home, ...(namespaces ? {} : {MEEPA_SANDBOX_NO_NAMESPACES: '1'})},
          reject: false,
        },
      )
      expect(result, `namespaces: ${namespaces}`).toMatchObject({exitCode: 0, stdout: 'started'})
      expect(running(token), `namespaces: ${namespaces}`).toBe(false)
    }
  })

  it.runIf(process.getuid?.() === 0)(
    'runs the command once when the clean-up after it fails (reported, the exit status kept, nothing handed to oclif)',
    async () => {
      // the fault: the command's file in its private TMPDIR made immutable (root, ext4 /tmp) while it sleeps, so its removal fails
      // (without the namespace layer: with it, TMPDIR is a tmpfs that goes with the run's namespace)
      const tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'exec-tmp-'))
      const argv = [
        '--agent',
        'lenient',
        '--',
        'sh',
        '-c',
        'echo ran >> ./count; echo x > "$TMPDIR/f"; sleep 2; exit 5',
      ]
      const count = path.join(home.workspace('lenient'), 'count')
      const results = []
      try {
        for (const via of [exec, execViaOclif]) {
          const running = via(argv, {TMPDIR: tmp, MEEPA_SANDBOX_NO_NAMESPACES: '1'})
          let file: string | undefined
          for (
            const deadline = Date.now() + 20_000;
            !file && Date.now() < deadline;
            await new Promise((resolve) => setTimeout(resolve, 50))
          ) {
            const dir = fs.readdirSync(tmp).find((name) => name.startsWith('meepa-sandbox-lenient-'))
            if (dir && fs.existsSync(path.join(tmp, dir, 'f'))) file = path.join(tmp, dir, 'f')
          }
          expect(file).toBeDefined()
          await execa('chattr', ['+i', file!])
          results.push(await running)
          await execa('chattr', ['-i', file!])
          fs.rmSync(path.dirname(file!), {recursive: true})
          expect(fs.readFileSync(count, 'utf8')).toBe('ran\n')
          fs.rmSync(count)
        }
      } finally {
        await execa('chattr', ['-R', '-i', tmp], {reject: false})
        fs.rmSync(tmp, {recursive: true, force: true})
      }
      const [fast, viaOclif] = results.map((result) => ({
        exitCode: result!.exitCode,
        stderr: result!.stderr.replace(/meepa-sandbox-lenient-\w+/, 'TMP'),
      }))
      expect(fast).toEqual(viaOclif)
      expect(fast).toMatchObject({
        exitCode: 5,
        stderr: expect.stringMatching(
          /could not remove the run's TMPDIR .*cannot remove 'f' at depth 1: Operation not permitted/,
        ),
      })
    },
  )

  it('hands errors and help to oclif: an unknown agent is E_AGENT_UNKNOWN with exit 4, --help is oclif help', async () => {
    const unknown = await exec(['--agent', 'nope', '--', 'true'])
    expect(unknown).toMatchObject({exitCode: 4, oclif: true})
    expect(unknown.stderr).toContain('unknown agent "nope"')
    const help = await exec(['--help'])
    expect(help).toMatchObject({exitCode: 0, oclif: true})
    expect(help.stdout).toContain('USAGE')
  })
})
