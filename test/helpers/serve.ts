import {execa, type ResultPromise} from 'execa'
import {BIN, runCli} from './home.js'

/** `meepagateway serve` from bin/run.js over dist/, as an operator runs it, with its output collected. */
export interface ServeProcess {
  process: ResultPromise
  /** stdout + stderr so far. */
  output(): string
  waitForOutput(pattern: RegExp, timeoutMs?: number): Promise<void>
  /** POST /api/chat; resolves with the status, the reply and how long it took. */
  chat(agent: string, message: string): Promise<{status: number; reply: string; ms: number}>
  healthz(): Promise<{status: number; body: {status: string; reasons?: string[]} & Record<string, unknown>}>
  /** SIGTERM, then waits for the exit; returns how long it took. */
  stop(): Promise<{ms: number; exitCode: number | undefined}>
}

export async function startServe(options: {
  home: string
  port: number
  env?: Record<string, string>
  apiKey?: string
  waitForListening?: boolean
}): Promise<ServeProcess & {apiKey: string}> {
  const apiKey =
    options.apiKey ??
    (JSON.parse((await runCli(['api-key', 'create', 'tests', '--json'], {home: options.home})).stdout) as {key: string})
      .key
  let output = ''
  const child = execa(process.execPath, [BIN, 'serve'], {
    env: {
      MEEPAGATEWAY_HOME: options.home,
      FAKE_LLM_KEY: 'sk-fake-test-key-123456',
      MEEPA_RETRY_BASE_MS: '20',
      ...options.env,
    },
    reject: false,
    timeout: 300_000,
    forceKillAfterDelay: false, // the shutdown's own timing is under test
  })
  child.stdout?.on('data', (chunk) => (output += String(chunk)))
  child.stderr?.on('data', (chunk) => (output += String(chunk)))
  const base = `http://127.0.0.1:${options.port}`
  const serve: ServeProcess & {apiKey: string} = {
    apiKey,
    process: child,
    output: () => output,
    waitForOutput: async (pattern, timeoutMs = 30_000) => {
      const until = Date.now() + timeoutMs
      while (!pattern.test(output)) {
        if (Date.now() > until || child.exitCode !== null)
          throw new Error(`serve did not log ${pattern} within ${timeoutMs} ms; it said:\n${output.slice(-4000)}`)
        await new Promise((resolve) => setTimeout(resolve, 100))
      }
    },
    chat: async (agent, message) => {
      const started = Date.now()
      const response = await fetch(`${base}/api/chat`, {
        method: 'POST',
        headers: {authorization: `Bearer ${apiKey}`, 'content-type': 'application/json'},
        body: JSON.stringify({agent, message}),
      })
      const body = (await response.json().catch(() => ({}))) as {reply?: string; error?: {message?: string}}
      return {status: response.status, reply: body.reply ?? JSON.stringify(body), ms: Date.now() - started}
    },
    healthz: async () => {
      const response = await fetch(`${base}/healthz`)
      return {status: response.status, body: (await response.json()) as {status: string; reasons?: string[]}}
    },
    stop: async () => {
      const started = Date.now()
      child.kill('SIGTERM')
      const result = await child
      return {ms: Date.now() - started, exitCode: result.exitCode}
    },
  }
  if (options.waitForListening !== false) await serve.waitForOutput(/listening on/)
  return serve
}
