import {afterEach} from 'vitest'
import {loadConfig} from '../../../src/runtime/config/load.js'
import type {CatchUpLimits} from '../../../src/runtime/connectors/catch-up.js'
import type {ConnectorTimings} from '../../../src/runtime/connectors/index.js'
import type {RunFunction} from '../../../src/runtime/gateway/dispatcher.js'
import {startGateway, type Gateway} from '../../../src/runtime/gateway/gateway.js'
import {ApiKeys} from '../../../src/runtime/state/api-keys.js'
import {successfulOutput} from '../../helpers/agent-run-output.js'
import {fakeLlmConfig, makeHome, type TestHome} from '../../helpers/home.js'

/** Connector timings short enough for tests: reconnects in tens of ms, no identify throttle. */
export const FAST_TIMINGS: ConnectorTimings = {
  meepachat: {backoff: {initialMs: 50, maxMs: 400}, pingIntervalMs: 200, typingIntervalMs: 100},
  slack: {backoff: {initialMs: 50, maxMs: 400}, clientPingTimeoutMs: 300, retryConfig: {retries: 0}},
  discord: {
    backoff: {initialMs: 50, maxMs: 400},
    typingIntervalMs: 100,
    clientOptions: {ws: {buildIdentifyThrottler: async () => ({waitForIdentify: async () => {}})}} as never,
  },
}

export interface TestGateway {
  gateway: Gateway
  home: TestHome
  logs: string[]
  apiKey: string
  chat(body: Record<string, unknown>, key?: string): Promise<{status: number; body: any}>
  waitForLog(pattern: RegExp, timeoutMs?: number): Promise<string>
  /** GET /healthz: what an operator's monitor sees. */
  health(): Promise<{status: number; body: {status: string; reasons?: string[]; connectors: Record<string, number>}}>
  close(): Promise<void>
}

/**
 * A gateway in this process on a free port, with a throwaway home. `llmBaseUrl` points the
 * agents at a fake LLM (real runs, unrestricted); `run` replaces the agent with a stub.
 */
export async function startTestGateway(options: {
  agents: Array<Record<string, unknown>>
  llmBaseUrl?: string
  run?: RunFunction
  gateway?: Record<string, unknown>
  /** More top-level config (e.g. `providers` for another wire format). */
  config?: Record<string, unknown>
  /** Prepares the home before the gateway starts (e.g. state a previous gateway left). */
  beforeStart?: (home: TestHome) => void
  /** The home of a gateway before this one (a restart); its caller cleans it up. */
  home?: TestHome
  catchUp?: CatchUpLimits
}): Promise<TestGateway> {
  const home =
    options.home ??
    makeHome(
      fakeLlmConfig(options.llmBaseUrl ?? 'http://127.0.0.1:9/v1', options.agents, {
        ...(options.gateway ? {gateway: options.gateway} : {}),
        ...options.config,
      }),
    )
  options.beforeStart?.(home)
  const loaded = loadConfig({
    configPath: home.configPath,
    home: home.home,
    env: {...process.env, FAKE_LLM_KEY: 'sk-fake-test-key-123456'},
  })
  const logs: string[] = []
  const logWaiters = new Set<() => void>()
  const gateway = await startGateway({
    loaded,
    unrestricted: true,
    port: 0,
    run: options.run,
    connectorTimings: {...FAST_TIMINGS, ...(options.catchUp ? {catchUp: options.catchUp} : {})},
    replyRetryBackoff: {initialMs: 100, maxMs: 400},
    log: (line) => {
      logs.push(line)
      if (process.env.MEEPA_TEST_VERBOSE) process.stderr.write(`${line}\n`)
      for (const waiter of logWaiters) waiter()
    },
  })
  const apiKey = new ApiKeys(gateway.db).create('test').key
  return {
    gateway,
    home,
    logs,
    apiKey,
    async chat(body, key = apiKey) {
      const response = await fetch(`${gateway.url}/api/chat`, {
        method: 'POST',
        headers: {'content-type': 'application/json', ...(key ? {authorization: `Bearer ${key}`} : {})},
        body: JSON.stringify(body),
      })
      return {status: response.status, body: await response.json()}
    },
    async health() {
      const response = await fetch(`${gateway.url}/healthz`)
      return {status: response.status, body: await response.json()}
    },
    waitForLog(pattern, timeoutMs = 10_000) {
      const find = () => logs.find((line) => pattern.test(line))
      const found = find()
      if (found) return Promise.resolve(found)
      return new Promise((resolve, reject) => {
        const waiter = () => {
          const line = find()
          if (!line) return
          logWaiters.delete(waiter)
          clearTimeout(timer)
          resolve(line)
        }
        const timer = setTimeout(() => {
          logWaiters.delete(waiter)
          reject(new Error(`no log line matching ${pattern}; got:\n${logs.join('\n')}`))
        }, timeoutMs)
        logWaiters.add(waiter)
      })
    },
    async close() {
      await gateway.stop({graceMs: 5000})
      if (!options.home) home.cleanup()
    },
  }
}

type Closable = {close(): Promise<void>}

/**
 * Registers an afterEach that closes what the test marked with the returned function, newest
 * first: a gateway stops before the fake platform it is connected to goes away.
 */
export function closeAfterEachTest(): <T extends Closable>(thing: T) => T {
  const open: Closable[] = []
  afterEach(async () => {
    for (const thing of open.splice(0).reverse()) await thing.close()
  })
  return (thing) => {
    open.push(thing)
    return thing
  }
}

/** A stub agent: replies `echo: <content>` after `delayMs`, or whatever `reply` returns. */
export function stubRun(
  options: {delayMs?: number; reply?: (content: string) => string; onStart?: (content: string) => void} = {},
): RunFunction {
  return async ({message, runId, signal}) => {
    options.onStart?.(message.content)
    const started = Date.now()
    if (options.delayMs) {
      await new Promise<void>((resolve) => {
        const timer = setTimeout(resolve, options.delayMs)
        signal.addEventListener('abort', () => {
          clearTimeout(timer)
          resolve()
        })
      })
    }
    if (signal.aborted) {
      return {
        runId,
        level: 'unrestricted',
        ms: Date.now() - started,
        output: {
          version: 1,
          ok: false,
          run_id: runId,
          error: {code: 'E_RUN', message: 'the run was cancelled', retryable: true},
        },
      }
    }
    const content = options.reply ? options.reply(message.content) : `echo: ${message.content}`
    return {
      runId,
      level: 'unrestricted',
      ms: Date.now() - started,
      output: successfulOutput(runId, content),
    }
  }
}
