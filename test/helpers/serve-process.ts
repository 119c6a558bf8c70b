import {execa, type ResultPromise} from 'execa'
import {BIN} from './home.js'

export interface ServeProcess {
  process: ResultPromise
  /** Where it listens, from its "listening on" line. */
  url: string
  /** Everything it logged so far (stdout and stderr). */
  output(): string
}

/**
 * Starts `node bin/run.js serve` (over dist/) and resolves once it listens. `prefix` runs it
 * through a wrapper command (e.g. `prlimit --nofile=256:256`).
 */
export async function startServeProcess(options: {home: string; configPath: string; args?: string[]; env?: Record<string, string>; prefix?: string[]; timeoutMs?: number}): Promise<ServeProcess> {
  let output = ''
  const [command, ...wrapperArgs] = [...(options.prefix ?? []), process.execPath]
  const serve = execa(command as string, [...wrapperArgs, BIN, 'serve', '--config', options.configPath, ...(options.args ?? ['--unrestricted'])], {
    env: {MEEPAGATEWAY_HOME: options.home, FAKE_LLM_KEY: 'sk-fake-test-key-123456', ...options.env},
    reject: false,
    timeout: options.timeoutMs ?? 60_000,
  })
  serve.stdout?.on('data', (chunk) => (output += String(chunk)))
  serve.stderr?.on('data', (chunk) => (output += String(chunk)))
  const deadline = Date.now() + 20_000
  while (!/listening on (http:\/\/\S+)/.test(output)) {
    if (serve.exitCode !== null || Date.now() > deadline) {
      serve.kill('SIGKILL')
      throw new Error(`serve did not start:\n${output}`)
    }
    await new Promise((resolve) => setTimeout(resolve, 50))
  }
  return {process: serve, url: (/listening on (http:\/\/\S+)/.exec(output) as RegExpExecArray)[1] as string, output: () => output}
}
