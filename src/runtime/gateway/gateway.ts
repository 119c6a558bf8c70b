import type {LoadedConfig} from '../config/types.js'
import {createConnector, connectorNames, type ConnectorTimings} from '../connectors/index.js'
import type {BackoffOptions} from '../connectors/backoff.js'
import type {Connector} from '../connectors/types.js'
import {DEFAULT_CATCH_UP} from '../connectors/catch-up.js'
import {InboundLedger} from '../state/inbound-ledger.js'
import {connectorConfigWarnings} from '../config/connector-warnings.js'
import {apiKeyCaller, mountWebChat} from '../connectors/webchat.js'
import {sendJson} from '../http/json.js'
import {Router} from '../http/router.js'
import {startHttpListener, type HttpListener} from '../http/server.js'
import {recordListening} from '../http/listening-record.js'
import {newRunId, runMessage} from '../runners/run-message.js'
import {reclaimAbandonedRuns} from '../run-lifecycle/reclaim-runs.js'
import {
  abandonEngineWork,
  probeEngine,
  stopStandbyAgentRuns,
  stopStandbyContainers,
  watchConfiguredEngines,
} from '../runners/index.js'
import {setStandbyBudget, standbyUsage} from '../runners/standby-budget.js'
import {insecureEngines} from '../config/load.js'
import {labelledByPath} from '../../sandbox/docker/home-label.js'
import {toGatewayError} from '../util/errors.js'
import {isolationLevelFor} from '../shapes/isolation-level.js'
import {ApiKeys, takeLegacyKeysNotice} from '../state/api-keys.js'
import {isSqliteDamage} from '../state/sqlite-damage.js'
import {GuardedGatewayDb} from '../state/db-guard.js'
import type {GatewayDb} from '../state/gateway-db.js'
import {RunRecords} from '../state/run-records.js'
import {findAgent} from '../config/load.js'
import {workspacePath} from '../workspace/location.js'
import {installIdFile, outboxSpoolDir} from '../util/paths.js'
import {readFilesToSend} from '../workspace/files-to-send.js'
import {deniedToAgent} from '../host-sandbox/agent-policy.js'
import {Dispatcher, type RunFunction} from './dispatcher.js'
import {GatewayHealth} from './health.js'
import {answerInterruptedRuns} from './restart-replies.js'
import {ReplyOutbox} from './reply-outbox.js'
import {RunQueue} from './run-queue.js'
import {listenForLocalSend, type LocalSendListener} from '../connectors/local-send/server.js'
import {assertSafeBind, hasCaptainPassword, isLoopbackBind, mountCaptain, type Captain} from '../captain/index.js'
import {auditFileEdit} from '../captain/config-audit.js'
import {AuditLog} from '../state/audit.js'
import {ConfigWatch, partsNeedingRestart} from './config-watch.js'
import {receiveInbox} from './inbox.js'
import {INBOX_SWEEP_INTERVAL_MS, pruneInboxes} from './inbox-retention.js'
import {attachmentCaps} from '../config/attachment-caps.js'
import {sizeBytes} from '../config/size.js'

export interface GatewayOptions {
  loaded: LoadedConfig
  /** --unrestricted: every agent runs without isolation, for this process only. */
  unrestricted?: boolean
  log: (line: string) => void
  /** Replaces runMessage (tests about queueing use a fast stub). */
  run?: RunFunction
  /** Overrides captain.port (tests pass 0 for a free port). */
  port?: number
  connectorTimings?: ConnectorTimings
  /** Between a reply's failed send attempts when the platform names no wait (tests shorten it). */
  replyRetryBackoff?: BackoffOptions
  /** Removes containers a crashed gateway left behind; a failure is logged, never fatal. */
  removeOrphans?: (signal: AbortSignal) => Promise<number>
  /** Watch config.yaml and apply (or refuse) hand edits while serving: `serve` does. */
  watchConfig?: boolean
}

export interface Gateway {
  readonly url: string
  /** Other parts of the gateway (the dashboard) add their routes here. */
  readonly router: Router
  readonly connectors: Connector[]
  readonly dispatcher: Dispatcher
  readonly queue: RunQueue
  readonly db: GatewayDb
  /** Why /healthz says `degraded` (empty when it says ok). */
  readonly health: GatewayHealth
  /** Chat replies on their way (or waiting for the platform). */
  readonly outbox: ReplyOutbox
  /** Graceful stop: no new messages, running ones finish within the grace period, then everything closes. */
  stop(options?: {graceMs?: number}): Promise<void>
  /** During stop(): stop waiting and abort running runs now (a second Ctrl-C). */
  abortRuns(): void
  /** Settles when stop() has finished. */
  readonly stopped: Promise<void>
}

/**
 * Starts the whole gateway: state, HTTP listener (health, web chat), dispatch and every
 * agent's connectors. Connectors connect in the background; one that cannot connect is
 * reported and retried and never stops the others.
 */
export async function startGateway(options: GatewayOptions): Promise<Gateway> {
  const {loaded, log} = options
  const {config} = loaded
  log(`gateway: starting with ${loaded.path} (state in ${loaded.home})`)
  // made or read before any run; one that cannot be used fails container runs, saying why (home-label.ts)
  let byPath = false
  try {
    byPath = labelledByPath(loaded.home)
  } catch (error) {
    log(`gateway: warning: ${toGatewayError(error).message}; container runs fail until it is fixed`)
  }
  if (config.engines?.length && byPath)
    log(
      `gateway: warning: this home's objects on engines are named after its path alone (${installIdFile(loaded.home)} says path): another machine's gateway whose home has the same path would take them for its own on an engine both use; docs/architecture.md, "The home label", says how to give it an id`,
    )
  // checked (PRAGMA quick_check) at start, and kept on the file at its path while serving
  const guarded = new GuardedGatewayDb(loaded.home, log)
  const db = guarded.db
  let watch: ConfigWatch | undefined
  try {
    const legacyKeys = takeLegacyKeysNotice(db)
    if (legacyKeys) log(legacyKeys)
    const records = new RunRecords(db)
    const stale = records.markStaleInterrupted()
    if (stale > 0) log(`gateway: marked ${stale} run(s) left running by a previous gateway as interrupted`)
    // processes are killed before this returns; removing their containers goes on in the background
    void reclaimAbandonedRuns(loaded.home, (line) => log(`gateway: ${line}`))
    // In the background: a slow or hung Docker engine must not delay the connectors, and a live
    // run's containers are never taken for orphans, so nothing races with the runs starting now.
    const orphanCheck = new AbortController()
    options.removeOrphans?.(orphanCheck.signal).then(
      (removed) => {
        if (removed > 0) log(`gateway: removed ${removed} container(s) left behind by a previous gateway`)
      },
      (error: Error) => {
        if (!orphanCheck.signal.aborted)
          log(
            `gateway: skipped the check for containers a previous gateway left behind: ${error.message.split('\n')[0]}`,
          )
      },
    )

    const agents = new Map(config.agents.map((agent) => [agent.id, agent]))
    // the dashboard edits agents and image_config; runs started after an edit use the new config
    let live = loaded
    const outbox = new ReplyOutbox({
      db,
      spoolDir: outboxSpoolDir(loaded.home),
      connectors: () => connectors,
      deliveryWindowMs: () => live.config.gateway.reply_delivery_minutes * 60_000,
      spoolLimitBytes: () => sizeBytes(live.config.gateway.max_outbox_spool_size, 'gateway.max_outbox_spool_size'),
      log,
      retryBackoff: options.replyRetryBackoff,
    })
    const health = new GatewayHealth({
      replies: () => ({pending: outbox.pending, undeliverableSince: (since) => outbox.undeliverableSince(since)}),
      home: loaded.home,
      usesContainers: () =>
        [...agents.values()].some((agent) => isolationLevelFor(agent, options.unrestricted) === 'container'),
      stateProblem: () => guarded.problem,
      connectors: () => connectors,
      probeEngine,
    })
    setStandbyBudget(config.gateway)
    const queue = new RunQueue({
      maxConcurrent: config.gateway.max_concurrent_runs,
      queueLimit: config.gateway.queue_limit,
    })
    const run: RunFunction =
      options.run ??
      (async ({agentId, message, runId, isolation, signal, onLog, files}) => {
        const loadedForRun = live
        const attachments = files
          ? await receiveInbox(loadedForRun, agentId, message.id, files, signal, (line) => log(`run ${runId}: ${line}`))
          : undefined
        const result = await runMessage({
          loaded: loadedForRun,
          agentId,
          message: attachments ? {...message, attachments} : message,
          runId,
          level: isolation,
          signal,
          unrestricted: options.unrestricted,
          standby: {wanted: () => dispatcher.accepting, log: (line) => log(`gateway: ${line}`)},
          onLog: (line) => {
            log(`run ${runId}: ${line}`)
            onLog?.(line)
          },
        })
        return attachments ? {...result, attachments} : result
      })
    const dispatcher = new Dispatcher({
      queue,
      records,
      run,
      // from the config the run will use; an agent no longer in it never runs (runMessage refuses it)
      isolationFor: (agentId) => {
        const agent = live.config.agents.find((candidate) => candidate.id === agentId) ?? agents.get(agentId)
        return agent ? isolationLevelFor(agent, options.unrestricted) : 'host-sandbox'
      },
      newRunId,
      log,
      // with the config of now: a cap lowered while the run went on applies to what it sends
      readFiles: (agentId, requested) => {
        const agent = findAgent(live, agentId)
        const workspace = workspacePath(live.home, agentId)
        return readFilesToSend(workspace, requested, agent.attachments, deniedToAgent(agent, workspace))
      },
      onRecordWrite: (error) => {
        if (error && isSqliteDamage(error)) guarded.suspect()
        health.recordWritten(error)
      },
      outbox,
    })

    for (const {agent, warning} of connectorConfigWarnings(config)) log(`gateway: WARNING: agent ${agent}: ${warning}`)
    const catchUp = options.connectorTimings?.catchUp ?? DEFAULT_CATCH_UP
    const inbound = new InboundLedger(db, catchUp.maxAgeMs)
    const connectors: Connector[] = []
    for (const agent of config.agents) {
      const names = connectorNames(agent.id, agent.connectors)
      for (const [index, connectorConfig] of agent.connectors.entries()) {
        const name = names[index] as string
        try {
          connectors.push(
            await createConnector(
              connectorConfig,
              {
                name,
                agentId: agent.id,
                log,
                onMessage: (message, delivery, files) =>
                  void dispatcher.dispatch(agent.id, message, delivery, files?.length ? {files} : {}),
                claim: (channelId, messageId, postedAt) => inbound.claim(name, channelId, messageId, postedAt),
                catchUp,
              },
              options.connectorTimings,
            ),
          )
        } catch (error) {
          log(`connector ${name}: cannot be set up: ${(error as Error).message}; skipped`)
        }
      }
    }

    const router = new Router()
    const started = Date.now()
    router.get('/healthz', ({res}) => {
      const states: Record<string, number> = {}
      for (const connector of connectors) states[connector.state] = (states[connector.state] ?? 0) + 1
      guarded.check()
      const reasons = health.reasons()
      const status = !dispatcher.accepting ? 'stopping' : reasons.length > 0 ? 'degraded' : 'ok'
      sendJson(res, status === 'ok' ? 200 : 503, {
        status,
        ...(reasons.length > 0 ? {reasons} : {}),
        uptime_s: Math.round((Date.now() - started) / 1000),
        agents: agents.size,
        connectors: states,
        runs: {running: queue.running, waiting: queue.waiting},
        standbys: standbyUsage(),
        replies: health.replies(),
      })
    })
    // a config written by the dashboard or by hand: runs started from now on use it; running ones keep theirs
    const applyConfig = (next: LoadedConfig) => {
      live = next
      // a standby started for the old config could serve the next message of an agent whose level changed
      void stopStandbyAgentRuns(loaded.home)
      if ([...agents.values()].some((agent) => isolationLevelFor(agent, options.unrestricted) === 'container'))
        void stopStandbyContainers().catch(() => {})
      for (const agent of next.config.agents) if (agents.has(agent.id)) agents.set(agent.id, agent)
    }
    let captain: Captain | undefined
    if (config.captain.enabled) {
      assertSafeBind(config.captain.bind, hasCaptainPassword(db))
      captain = await mountCaptain(router, {
        db,
        loaded,
        log,
        connectors: () => connectors,
        // loaded when the dashboard first asks: a gateway without container agents never loads Docker code
        engines: async () => {
          const [{engineViews}, {standbysOn}] = await Promise.all([
            import('../runners/container/engines.js'),
            import('../runners/container/standby-pool.js'),
          ])
          return engineViews(live.config, standbysOn)
        },
        unrestricted: options.unrestricted,
        syncConfigFile: options.watchConfig ? () => watch?.sync() : undefined,
      })
      captain.onConfigChange((next) => applyConfig(next))
    }
    if (options.watchConfig) {
      const audit = new AuditLog(db, log)
      watch = new ConfigWatch({
        current: () => live,
        log,
        apply: (next) => {
          const previous = live
          try {
            auditFileEdit(
              audit,
              {text: previous.text ?? '', config: previous.config},
              {text: next.text ?? '', config: next.config},
            )
          } catch (error) {
            // the file is the operator's: it runs as written even when gateway.db cannot take the entry
            log(
              `gateway: could not write the audit entry of the change to ${next.path} (applied anyway): ${(error as Error).message}`,
            )
          }
          applyConfig(next)
          captain?.replaceConfig(next)
          const restart = partsNeedingRestart(previous.config, next.config)
          log(
            `gateway: applied the change to ${next.path}; the next message of each agent runs with it` +
              (restart.length > 0 ? `; a restart is needed for: ${restart.join(', ')}` : ''),
          )
        },
      })
    }
    mountWebChat({
      router,
      dispatcher,
      agentIds: () => [...agents.keys()],
      caller: captain?.chatCaller ?? apiKeyCaller(new ApiKeys(db)),
      runs: records,
      maxAttachmentBytes: () =>
        Math.max(0, ...live.config.agents.map((agent) => attachmentCaps(agent.attachments).totalBytes)),
      maxQueuedFileBytes: () =>
        sizeBytes(live.config.gateway.max_queued_chat_files_size, 'gateway.max_queued_chat_files_size'),
    })
    const http: HttpListener = await startHttpListener({
      bind: config.captain.bind,
      port: options.port ?? config.captain.port,
      router,
      log,
      allowedHosts: () => live.config.captain.allowed_hosts,
    })
    log(
      `gateway: listening on ${http.url} (health: /healthz, web chat: POST /api/chat); ${agents.size} agent(s), ${connectors.length} connector(s)` +
        (options.unrestricted ? '; --unrestricted: every agent runs WITHOUT isolation' : ''),
    )
    captain?.announce(http.url.replace(/\/$/, ''))
    let forgetListening = () => {}
    try {
      forgetListening = recordListening(loaded.home, {bind: config.captain.bind, port: http.port})
    } catch (error) {
      log(
        `gateway: cannot record where it listens (${(error as Error).message}); dashboard link prints the port of the config`,
      )
    }
    const localSend: LocalSendListener | undefined = await listenForLocalSend({
      home: loaded.home,
      // the text runs are made from (a dashboard or hand edit replaces both), caught up with the file first
      config: () => {
        watch?.sync()
        return {path: live.path, text: live.text}
      },
      unrestricted: Boolean(options.unrestricted),
      agentIds: () => [...agents.keys()],
      dispatcher,
      queue,
      log,
    })

    if (!isLoopbackBind(config.captain.bind) && config.captain.allowed_hosts.length === 0) {
      log(
        `gateway: captain.bind is ${config.captain.bind}, but only requests naming 127.0.0.1/localhost are answered; list the names clients use in captain.allowed_hosts`,
      )
    }
    for (const connector of connectors) connector.start()
    outbox.resume()
    health.watch()
    for (const name of insecureEngines(config))
      log(
        `gateway: warning: engine ${name} is reached without TLS (insecure: true): anyone who reaches its port can run anything there`,
      )
    void watchConfiguredEngines(config)
    // received files do not stay for ever: at start, then hourly, with the config of the moment
    const sweepInboxes = () => void pruneInboxes(live, log)
    sweepInboxes()
    const inboxSweep = setInterval(sweepInboxes, INBOX_SWEEP_INTERVAL_MS).unref()
    try {
      answerInterruptedRuns({records, connectors, outbox, log})
    } catch (error) {
      log(`gateway: could not queue the replies owed from before the restart: ${(error as Error).message}`)
    }

    let stopping: Promise<void> | undefined
    let markStopped!: () => void
    const stopped = new Promise<void>((resolve) => (markStopped = resolve))
    const stop = async (stopOptions: {graceMs?: number} = {}): Promise<void> => {
      orphanCheck.abort()
      clearInterval(inboxSweep)
      health.stop()
      localSend?.close()
      watch?.close()
      const graceMs = stopOptions.graceMs ?? config.gateway.shutdown_grace_seconds * 1000
      if (queue.running > 0)
        log(`gateway: stopping; waiting up to ${Math.round(graceMs / 1000)} s for ${queue.running} running run(s)`)
      else log('gateway: stopping')
      // standbys go while runs drain: a hung engine must not add its wait to the grace period
      const standbysStopped = stopStandbyContainers()
      const agentRunsStopped = stopStandbyAgentRuns(loaded.home)
      const {aborted} = await dispatcher.drain(graceMs)
      if (aborted > 0) log(`gateway: stopped ${aborted} run(s) still running after the grace period`)
      await outbox.stop()
      await Promise.all(connectors.map((connector) => connector.stop().catch(() => {})))
      // again: a run that ended during the drain may have prepared one
      const left = [
        ...(await standbysStopped.catch(() => [])),
        ...(await stopStandbyContainers().catch(() => [])),
        ...(await abandonEngineWork()),
      ]
      await Promise.all([agentRunsStopped, stopStandbyAgentRuns(loaded.home)])
      if (left.length > 0)
        log(
          `gateway: the Docker engine did not answer; left container(s) ${[...new Set(left)].join(', ')} for the next start-up (or container clean) to remove`,
        )
      captain?.close() // ends running builds and so their event streams, which would hold the listener open
      await Promise.race([http.close(), new Promise((resolve) => setTimeout(resolve, 5000).unref())])
      forgetListening()
      guarded.close()
      log('gateway: stopped')
      markStopped()
    }

    return {
      url: http.url,
      router,
      connectors,
      dispatcher,
      queue,
      db,
      health,
      outbox,
      stop: (stopOptions) => (stopping ??= stop(stopOptions)),
      abortRuns: () => dispatcher.abortRuns(),
      stopped,
    }
  } catch (error) {
    watch?.close()
    guarded.close()
    throw error
  }
}
