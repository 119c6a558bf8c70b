import {execa} from 'execa'
import {execFileSync} from 'node:child_process'
import fs from 'node:fs'
import os from 'node:os'
import path from 'node:path'
import {afterAll, beforeAll, expect, it} from 'vitest'
import {BIN, makeHome, type TestHome} from '../helpers/home.js'

// bin/run.js run as installed (through its #! line): Node 20 reads every certificate of
// NODE_EXTRA_CA_CERTS as it starts, so the commands that open no TLS connection start Node without
// the variable, and get it back in their environment before anything runs.
let home: TestHome
let dir: string
let fifo: string
beforeAll(() => {
  home = makeHome({
    providers: {
      primary: 'fake',
      providers: {fake: {kind: 'openai', api_key_env: 'FAKE_LLM_KEY', model: 'm', base_url: 'http://127.0.0.1:1/v1'}},
    },
    agents: [{id: 'a'}],
  })
  dir = fs.mkdtempSync(path.join(os.tmpdir(), 'meepa-ca-'))
  // Node's start opens the file and reads it: on a FIFO with no writer that open blocks
  fifo = path.join(dir, 'ca.pem')
  execFileSync('mkfifo', [fifo])
})
afterAll(() => {
  home.cleanup()
  fs.rmSync(dir, {recursive: true, force: true})
})

const env = (extra: Record<string, string> = {}) => ({
  PATH: process.env.PATH ?? '',
  MEEPAGATEWAY_HOME: home.home,
  FAKE_LLM_KEY: 'k',
  NODE_EXTRA_CA_CERTS: fifo,
  ...extra,
})

it('a command that opens no TLS connection never reads the certificates, whatever it is', async () => {
  for (const argv of [
    ['config', 'check'],
    ['agent', 'list'],
    ['runs'],
    ['--version'],
    ['--help'],
    ['sandbox', 'explain', '--agent', 'a'],
  ]) {
    const result = await execa(BIN, argv, {env: env(), extendEnv: false, reject: false, timeout: 30_000})
    expect(result.timedOut, argv.join(' ')).toBe(false)
    expect(result.exitCode, `${argv.join(' ')}: ${result.stderr}`).toBe(0)
  }
})

it('a command that may open one (send, serve) has Node read them as it starts', async () => {
  const send = execa(BIN, ['send', '--agent', 'a', 'hi'], {env: env(), extendEnv: false, reject: false})
  try {
    // a writer can open the FIFO once Node has opened it for reading
    let reader = false
    for (
      const deadline = Date.now() + 20_000;
      !reader && Date.now() < deadline;
      await new Promise((resolve) => setTimeout(resolve, 50))
    ) {
      try {
        fs.closeSync(fs.openSync(fifo, fs.constants.O_WRONLY | fs.constants.O_NONBLOCK))
        reader = true
      } catch (error) {
        if ((error as NodeJS.ErrnoException).code !== 'ENXIO') throw error
      }
    }
    expect(reader).toBe(true)
  } finally {
    send.kill('SIGKILL')
    await send
  }
})

/** The command's environment as its process sees it, once it has started. */
async function environmentOf(argv: string[], extra: Record<string, string>, without: string[] = []) {
  const report = path.join(dir, 'env.json')
  const hook = path.join(dir, 'hook.cjs')
  fs.writeFileSync(
    hook,
    `process.on('exit', () => require('node:fs').writeFileSync(${JSON.stringify(report)}, JSON.stringify({given: process.env.NODE_EXTRA_CA_CERTS ?? null, handedOver: process.env.MEEPAGATEWAY_DEFERRED_EXTRA_CA_CERTS ?? null})))\n`,
  )
  const environment: Record<string, string> = env({...extra, NODE_OPTIONS: `--require ${hook}`})
  for (const name of without) delete environment[name]
  const result = await execa(BIN, argv, {env: environment, extendEnv: false, reject: false})
  expect(result.exitCode, result.stderr).toBe(0)
  return JSON.parse(fs.readFileSync(report, 'utf8')) as {given: string | null; handedOver: string | null}
}

it('the command gets the variable back, as it was given, for what it starts', async () => {
  const given = path.join(dir, 'certificates with spaces.pem')
  expect(await environmentOf(['config', 'check'], {NODE_EXTRA_CA_CERTS: given})).toEqual({given, handedOver: null})
})

it("a value of the handover variable in the caller's environment is not taken for NODE_EXTRA_CA_CERTS", async () => {
  const planted = path.join(dir, 'planted.pem')
  for (const argv of [['config', 'check'], ['runs']]) {
    expect(await environmentOf(argv, {MEEPAGATEWAY_DEFERRED_EXTRA_CA_CERTS: planted}, ['NODE_EXTRA_CA_CERTS'])).toEqual(
      {given: null, handedOver: null},
    )
  }
})

it('starts under a /bin/sh that is bash with nounset inherited (SHELLOPTS), with and without arguments', async () => {
  const bash = ['/bin/bash', '/usr/bin/bash'].find((file) => fs.existsSync(file))
  expect(bash).toBeDefined()
  // bash started as sh, as where /bin/sh is bash; it takes its options from an exported SHELLOPTS
  const sh = path.join(dir, 'sh')
  fs.symlinkSync(bash as string, sh)
  for (const argv of [[], ['runs'], ['--version']]) {
    const {NODE_EXTRA_CA_CERTS: _fifo, ...rest} = env({SHELLOPTS: 'nounset'})
    const result = await execa(sh, [BIN, ...argv], {env: rest, extendEnv: false, reject: false, timeout: 30_000})
    expect(result.exitCode, `${argv.join(' ')}: ${result.stderr}`).toBe(0)
  }
})
