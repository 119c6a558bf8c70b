import net from 'node:net'
import {GatewayError} from '../util/errors.js'

/** True for addresses only this machine can reach: 127.0.0.0/8, ::1, localhost. */
export function isLoopbackBind(bind: string): boolean {
  const host = bind
    .trim()
    .replace(/^\[|\]$/g, '')
    .toLowerCase()
  if (host === 'localhost' || host === 'localhost.') return true
  if (net.isIPv4(host)) return host.startsWith('127.')
  if (net.isIPv6(host)) {
    if (host === '::1' || host === '0:0:0:0:0:0:0:1') return true
    const mapped = /^::ffff:(\d+\.\d+\.\d+\.\d+)$/.exec(host)
    return mapped ? mapped[1]!.startsWith('127.') : false
  }
  return false
}

/**
 * `serve` calls this before listening: a dashboard reachable from the network without a password
 * would let anyone on it run agents (possibly unrestricted) on this machine, and the one-time
 * setup code is only meant for someone at this terminal.
 */
export function assertSafeBind(bind: string, hasPassword: boolean): void {
  if (hasPassword || isLoopbackBind(bind)) return
  throw new GatewayError(
    'E_CONFIG',
    `refusing to serve the dashboard on ${bind}, which other machines can reach, while no dashboard password is set`,
    {
      suggestions: [
        'set MEEPAGATEWAY_PASSWORD in the environment of `meepagateway serve`',
        'or set the password once on a loopback bind (captain.bind: 127.0.0.1) through the setup page, then change the bind',
        'or keep captain.bind: 127.0.0.1 and reach it through an SSH tunnel',
      ],
    },
  )
}
