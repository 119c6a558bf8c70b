import type {LoadedConfig} from '../config/types.js'
import {runningListener} from '../http/listening-record.js'
import {GatewayError} from '../util/errors.js'
import {AuditLog} from '../state/audit.js'
import {withGatewayDb} from '../state/gateway-db.js'
import {CaptainAuthStore, LOGIN_LINK_TTL_MS} from './auth-store.js'
import {UI_BASE} from './static.js'

export interface DashboardLink {
  url: string
  expires_in_s: number
}

/**
 * `meepagateway dashboard link`: a one-time login URL. Minting needs write access to gateway.db
 * (the operator's, denied to sandboxed agents), so it is the operator's way in that no neighbour
 * can block or use. The secret is in the fragment: browsers never send it to a server or a Referer.
 * The URL names where a running gateway of this home listens, else the config's port.
 */
export function mintDashboardLink(loaded: LoadedConfig): DashboardLink {
  const origin = dashboardOrigin(loaded)
  const secret = withGatewayDb(loaded.home, (db) => {
    const minted = new CaptainAuthStore(db).createLoginLink()
    new AuditLog(db).record({
      event: 'login_link_created',
      principal: 'cli',
      summary: 'one-time dashboard login link created',
    })
    return minted
  })
  return {url: `${origin}${UI_BASE}#login=${secret}`, expires_in_s: LOGIN_LINK_TTL_MS / 1000}
}

/**
 * `http://host:port` of the dashboard: the port the running gateway got (with captain.port 0, one
 * chosen at start-up).
 */
function dashboardOrigin(loaded: LoadedConfig): string {
  const running = runningListener(loaded.home)
  const {bind, port} = running ?? loaded.config.captain
  if (port === 0) {
    throw new GatewayError(
      'E_CONFIG',
      `captain.port is 0 in ${loaded.path}: the dashboard listens on a port chosen when the gateway starts, and no gateway of ${loaded.home} is running`,
      {
        suggestions: [
          'start the gateway (meepagateway serve), then run meepagateway dashboard link again',
          'or set captain.port in config.yaml to a fixed port',
        ],
      },
    )
  }
  const host = bind === '0.0.0.0' || bind === '::' ? '127.0.0.1' : bind.includes(':') ? `[${bind}]` : bind
  return `http://${host}:${port}`
}
