import {removeOrphanContainers} from '../container/clean.js'
import type {LoadedConfig} from '../config/types.js'
import {escapeControls} from '../util/escape-controls.js'
import {redactSecrets} from '../util/redact.js'
import {startGateway, type GatewayOptions} from './gateway.js'
import {lockGatewayHome} from './home-lock.js'

/** Bounded: a hung Docker engine must not keep the check running forever. */
const ORPHAN_CHECK_TIMEOUT_MS = 15_000

export interface ServeOptions extends Omit<GatewayOptions, 'log' | 'loaded'> {
  /** MEEPAGATEWAY_HOME: locked before the config is loaded or any state is read. */
  home: string
  /** Loads the config (writing the default on first use): called once the home is locked. */
  loadConfig: () => LoadedConfig
  /** Receives every log line, already time-stamped. */
  log: (line: string) => void
  /** Where SIGINT/SIGTERM come from (the process; tests pass an emitter). */
  signals?: NodeJS.EventEmitter
}

export interface ServeResult {
  stoppedBy: string
  url: string
}

/**
 * `meepagateway serve`: runs the gateway until SIGINT or SIGTERM, then drains it (running
 * runs finish within `gateway.shutdown_grace_seconds`). A second signal stops waiting and
 * aborts the runs still going; their records end as `interrupted`.
 */
export async function serveGateway(options: ServeOptions): Promise<ServeResult> {
  // First of all: a second gateway on this home must not touch its state (mark its runs
  // interrupted, answer its messages too)
  const lock = await lockGatewayHome(options.home)
  try {
    return await serveLocked(options, options.loadConfig())
  } finally {
    lock.release()
  }
}

async function serveLocked(options: ServeOptions, loaded: LoadedConfig): Promise<ServeResult> {
  // Library errors end up in log lines; no configured secret (tokens, keys) may reach the log, and
  // the control characters an engine, a daemon or a platform put in its words (a forged line, a
  // terminal escape) are shown escaped, never obeyed.
  const secretValues = Object.values(loaded.secrets)
  const log = (line: string) =>
    options.log(`${new Date().toISOString()} ${escapeControls(redactSecrets(line, secretValues))}`)
  const signals = options.signals ?? process
  const gateway = await startGateway({
    removeOrphans: async (signal) =>
      (
        await removeOrphanContainers({
          home: loaded.home,
          signal: AbortSignal.any([signal, AbortSignal.timeout(ORPHAN_CHECK_TIMEOUT_MS)]),
        })
      ).length,
    ...options,
    loaded,
    log,
    watchConfig: true,
  })

  // A long-running gateway must not die of one library's stray promise: report it and go on.
  const onUnhandled = (reason: unknown) =>
    log(`gateway: unexpected error (still running): ${reason instanceof Error ? reason.message : String(reason)}`)
  process.on('unhandledRejection', onUnhandled)

  const stoppedBy = await new Promise<string>((resolve) => {
    let received: string | undefined
    const onSignal = (signal: string) => {
      if (received) {
        log(`gateway: ${signal} again: aborting the running runs now`)
        gateway.abortRuns()
        return
      }
      received = signal
      log(`gateway: ${signal} received`)
      void gateway.stop().then(() => resolve(signal))
    }
    const onInt = () => onSignal('SIGINT')
    const onTerm = () => onSignal('SIGTERM')
    signals.on('SIGINT', onInt)
    signals.on('SIGTERM', onTerm)
    void gateway.stopped.then(() => {
      signals.off('SIGINT', onInt)
      signals.off('SIGTERM', onTerm)
    })
  })
  process.off('unhandledRejection', onUnhandled)
  return {stoppedBy, url: gateway.url}
}
