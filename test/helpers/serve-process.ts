import {execa, type ResultPromise} from 'execa'
import {afterEach} from 'vitest'
import {BIN} from './home.js'

export interface ServeProcess {
  process: ResultPromise
  /** Where it listens, from its "listening on" line. */
  url: string
  /** Everything it logged so far (stdout and stderr). */
  output(): string
}

export interface ServeProcessOptions {
  home: string
  /** --config; omitted, serve reads the home's config.yaml. */
  configPath?: string
  args?: string[]
  env?: Record<string, string>
  prefix?: string[]
  /** How long serve may run before it is killed (60 s). */
  timeoutMs?: number
}

/**
 * Starts `node bin/run.js serve` (over dist/) and returns at once: `listening()` says whether it
 * serves yet. `prefix` runs it through a wrapper command (e.g. `prlimit --nofile=256:256`).
 */
export function spawnServeProcess(
  options: ServeProcessOptions,
): Omit<ServeProcess, 'url'> & {listening(): string | undefined} {
  let output = ''
  const [command, ...wrapperArgs] = [...(options.prefix ?? []), process.execPath]
  const configArgs = options.configPath === undefined ? [] : ['--config', options.configPath]
  const serve = execa(
    command as string,
    [...wrapperArgs, BIN, 'serve', ...configArgs, ...(options.args ?? ['--unrestricted'])],
    {
      env: {MEEPAGATEWAY_HOME: options.home, FAKE_LLM_KEY: 'sk-fake-test-key-123456', ...options.env},
      reject: false,
      timeout: options.timeoutMs ?? 60_000,
    },
  )
  serve.stdout?.on('data', (chunk) => (output += String(chunk)))
  serve.stderr?.on('data', (chunk) => (output += String(chunk)))
  return {process: serve, output: () => output, listening: () => /listening on (http:\/\/\S+)/.exec(output)?.[1]}
}

/** spawnServeProcess, resolved once it listens. */
export async function startServeProcess(options: ServeProcessOptions): Promise<ServeProcess> {
  const serve = spawnServeProcess(options)
  const deadline = Date.now() + 20_000
  while (!serve.listening()) {
    if (serve.process.exitCode !== null || Date.now() > deadline) {
      serve.process.kill('SIGKILL')
      throw new Error(`serve did not start:\n${serve.output()}`)
    }
    await new Promise((resolve) => setTimeout(resolve, 50))
  }
  return {process: serve.process, url: serve.listening() as string, output: serve.output}
}

/**
 * A list to put each test's serve processes in: after each test they are SIGKILLed (a failed test
 * leaves none running).
 */
export function serveProcessesKilledAfterEach(): ResultPromise[] {
  const serves: ResultPromise[] = []
  afterEach(async () => {
    for (const serve of serves.splice(0)) {
      serve.kill('SIGKILL')
      await serve.catch(() => {})
    }
  })
  return serves
}
