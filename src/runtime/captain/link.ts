import type {LoadedConfig} from '../config/types.js'
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
 */
export function mintDashboardLink(loaded: LoadedConfig): DashboardLink {
  const secret = withGatewayDb(loaded.home, (db) => {
    const minted = new CaptainAuthStore(db).createLoginLink()
    new AuditLog(db).record({event: 'login_link_created', principal: 'cli', summary: 'one-time dashboard login link created'})
    return minted
  })
  const {bind, port} = loaded.config.captain
  const host = bind === '0.0.0.0' || bind === '::' ? '127.0.0.1' : bind.includes(':') ? `[${bind}]` : bind
  return {url: `http://${host}:${port}${UI_BASE}#login=${secret}`, expires_in_s: LOGIN_LINK_TTL_MS / 1000}
}
