import type {IncomingMessage} from 'node:http'
import type {LoadedConfig} from '../config/types.js'
import type {Router} from '../http/router.js'
import {ApiKeys} from '../state/api-keys.js'
import {AuditLog} from '../state/audit.js'
import type {ChatCaller} from '../connectors/webchat.js'
import type {EngineView} from '../shapes/engine-view.js'
import type {GatewayDb} from '../state/gateway-db.js'
import {RunRecords} from '../state/run-records.js'
import {dockerCli, type DockerCli} from '../../sandbox/docker/cli.js'
import {mountCaptainApi, type LiveConnector} from './api.js'
import {CaptainAuth, PASSWORD_ENV} from './auth.js'
import {CaptainAuthStore} from './auth-store.js'
import {BuildJobs} from './build-jobs.js'
import {ConfigEditor} from './config-editor.js'
import {mountStaticUi, UI_BASE, UI_DIR} from './static.js'

export {assertSafeBind, isLoopbackBind} from '../http/bind.js'
export type {ConfigChange, ConfigListener} from './config-editor.js'

export interface CaptainDeps {
  db: GatewayDb
  /** The config the gateway started with; the dashboard keeps its own copy current after edits. */
  loaded: LoadedConfig
  log: (line: string) => void
  env?: NodeJS.ProcessEnv
  apiKeys?: ApiKeys
  runs?: RunRecords
  /** The gateway's live connectors (state shown on the Overview page). */
  connectors?: () => ReadonlyArray<LiveConnector>
  /** The engines runs go to, each with its health, runs, standbys and version (Overview page). */
  engines?: () => Promise<EngineView[]>
  unrestricted?: boolean
  /** Catches the gateway up with config.yaml (serve's watch); returns why the file is refused, if it is. */
  syncConfigFile?: () => string | undefined
  /** The docker CLI of the container pages (default: the process-wide one; tests pass a missing one). */
  docker?: DockerCli
  uiDir?: string
}

export interface Captain {
  /** Prints where the dashboard is (or the first-time setup code), once the listener is bound. */
  announce(origin: string): void
  /**
   * Subscribe to config changes made in the dashboard (already validated and written). Apply what
   * can be applied live; return `{restartRequired: [...]}` for the rest.
   */
  onConfigChange: ConfigEditor['onChange']
  /** Tell the dashboard about a config the gateway reloaded by itself. */
  replaceConfig(loaded: LoadedConfig): void
  /** The setup code while no password is set (printed by `announce`). */
  readonly setupCode: string | undefined
  /**
   * For the web chat connector: who is chatting (a chat or admin key, or the dashboard session),
   * from the request's bearer token; throws HttpError 401 without a valid one.
   */
  chatCaller(req: IncomingMessage): ChatCaller
  /** Aborts running builds (gateway shutdown). */
  close(): void
}

/** Whether the dashboard has a password (before mounting: `serve` checks this against the bind). */
export function hasCaptainPassword(db: GatewayDb, env: NodeJS.ProcessEnv = process.env): boolean {
  return Boolean(env[PASSWORD_ENV]) || new CaptainAuthStore(db).passwordHash() !== undefined
}

/**
 * Mounts the Captain dashboard on the gateway's router: the JSON API under /api/captain/, the
 * pages under /captain/. Prints the one-time setup code when no password is set.
 */
export async function mountCaptain(router: Router, deps: CaptainDeps): Promise<Captain> {
  const env = deps.env ?? process.env
  const apiKeys = deps.apiKeys ?? new ApiKeys(deps.db)
  const audit = new AuditLog(deps.db, deps.log)
  const auth = new CaptainAuth(new CaptainAuthStore(deps.db), apiKeys, {env, log: deps.log, audit})
  await auth.init()
  const editor = new ConfigEditor(deps.loaded, env, deps.syncConfigFile)
  const docker = () => deps.docker ?? dockerCli()
  const builds = new BuildJobs(docker)

  mountCaptainApi({
    router,
    auth,
    apiKeys,
    runs: deps.runs ?? new RunRecords(deps.db),
    audit,
    editor,
    builds,
    docker,
    connectors: deps.connectors ?? (() => []),
    engines: deps.engines ?? (async () => []),
    unrestricted: deps.unrestricted ?? false,
  })
  mountStaticUi(router, deps.uiDir ?? UI_DIR)

  const setupCode = auth.pendingSetupCode
  // The URL is known only once the listener is bound (port 0 picks one): the gateway prints it then.
  const announce = (origin: string) => {
    if (setupCode) {
      deps.log('captain: FIRST-TIME SETUP: no dashboard password is set')
      deps.log(
        `captain: open ${origin}/setup and enter the setup code ${setupCode} (or set ${PASSWORD_ENV} and restart)`,
      )
    } else {
      deps.log(`captain: dashboard at ${origin}${UI_BASE}`)
    }
  }

  return {
    announce,
    onConfigChange: (listener) => editor.onChange(listener),
    replaceConfig: (loaded) => editor.replace(loaded),
    setupCode,
    chatCaller(req) {
      const principal = auth.authenticate(req, 'chat')
      return principal.kind === 'session'
        ? {id: 'captain', name: 'dashboard'}
        : {id: principal.keyId, name: principal.name}
    },
    close: () => builds.abortAll(),
  }
}
