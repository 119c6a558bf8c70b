import dns from 'node:dns'
import http from 'node:http'
import https from 'node:https'
import net from 'node:net'
import {errorCode} from '../util/errors.js'

/**
 * The one way the gateway fetches a file a chat platform names (an attachment's URL). A message's
 * URL is chosen by whoever wrote the message, so it is not trusted: only the connector's own
 * origins are fetched (scheme, host and port exactly), a platform file host only at public
 * addresses (checked on the address actually connected to, so DNS cannot rebind it to the
 * metadata service), every redirect is checked the same way, and the body is cut at the cap
 * while it streams, whatever Content-Length said.
 */

export interface AllowedOrigin {
  /** `https://files.slack.com`: scheme, host and port, as URL.origin spells it. */
  origin: string
  /**
   * True for a platform's own host (files.slack.com, Discord's CDN): it must resolve to public
   * addresses only. False for a server the operator configured (MeepaChat's URL, a test's
   * api_url), which may well be on the LAN.
   */
  publicOnly: boolean
  /** Sent only to this origin (a redirect elsewhere drops it). */
  headers?: Record<string, string>
  /** False: the operator's `tls_verify: false` for this server (a self-signed certificate). */
  verifyTls?: boolean
}

export interface DownloadOptions {
  allowed: AllowedOrigin[]
  /** The body is cut here: more is a DownloadRefused('too-large'). */
  maxBytes: number
  signal?: AbortSignal
  /** Until the response headers arrive, and then between two chunks of the body. */
  idleTimeoutMs?: number
  /** The whole download. */
  totalTimeoutMs?: number
  maxRedirects?: number
  /** Sees the final response's headers before the body: throwing a DownloadRefused refuses it. */
  onResponse?: (headers: http.IncomingHttpHeaders) => void
  /** Tests resolve a name to a private address here; production uses the system resolver. */
  lookup?: typeof dns.lookup
}

export type RefusalKind = 'origin' | 'address' | 'too-large' | 'http' | 'timeout' | 'network' | 'redirects'

/** Why a file was not fetched, in words a user can read (`reason`). */
export class DownloadRefused extends Error {
  constructor(
    readonly kind: RefusalKind,
    readonly reason: string,
    /** The HTTP status, for kind 'http'. */
    readonly status?: number,
  ) {
    super(reason)
  }
}

const DEFAULT_IDLE_TIMEOUT_MS = 15_000
const DEFAULT_TOTAL_TIMEOUT_MS = 120_000
const DEFAULT_MAX_REDIRECTS = 3

/** Everything but the public internet: loopback, private, CGNAT, link-local (metadata), multicast, reserved. */
const NON_PUBLIC = new net.BlockList()
for (const [prefix, bits] of [
  ['0.0.0.0', 8],
  ['10.0.0.0', 8],
  ['100.64.0.0', 10],
  ['127.0.0.0', 8],
  ['169.254.0.0', 16],
  ['172.16.0.0', 12],
  ['192.0.0.0', 24],
  ['192.168.0.0', 16],
  ['198.18.0.0', 15],
  ['224.0.0.0', 3],
] as const)
  NON_PUBLIC.addSubnet(prefix, bits, 'ipv4')
for (const [prefix, bits] of [
  ['::', 127],
  ['64:ff9b::', 96],
  ['fc00::', 7],
  ['fe80::', 10],
  ['ff00::', 8],
] as const)
  NON_PUBLIC.addSubnet(prefix, bits, 'ipv6')

/** False for any address a download from a platform's host must never reach. */
export function isPublicAddress(address: string): boolean {
  const mapped = /^::ffff:(\d+\.\d+\.\d+\.\d+)$/i.exec(address)
  if (mapped) return isPublicAddress(mapped[1] as string)
  const family = net.isIPv4(address) ? 'ipv4' : net.isIPv6(address) ? 'ipv6' : undefined
  return family !== undefined && !NON_PUBLIC.check(address, family)
}

function duration(ms: number): string {
  return ms < 1000 ? `${ms} ms` : `${Math.round(ms / 1000)} s`
}

function hostOf(url: URL): string {
  return url.hostname.replace(/^\[|\]$/g, '')
}

/** The allowed origin `url` belongs to, or a refusal naming what it is not. */
function originFor(url: URL, allowed: AllowedOrigin[]): AllowedOrigin {
  if (url.protocol !== 'https:' && url.protocol !== 'http:')
    throw new DownloadRefused('origin', `${url.protocol} is not a download scheme`)
  if (url.username || url.password) throw new DownloadRefused('origin', 'a URL with credentials in it is refused')
  const match = allowed.find((candidate) => candidate.origin === url.origin)
  if (!match)
    throw new DownloadRefused(
      'origin',
      `${url.origin} is not the platform's file server (${allowed.map((candidate) => candidate.origin).join(', ')})`,
    )
  const host = hostOf(url)
  if (match.publicOnly && net.isIP(host) && !isPublicAddress(host))
    throw new DownloadRefused('address', `${host} is not a public address`)
  return match
}

/** A lookup that answers only public addresses (a platform host that resolves inward is refused). */
function publicLookup(lookup: typeof dns.lookup): typeof dns.lookup {
  return ((hostname: string, options: dns.LookupOptions, callback: (...args: unknown[]) => void) => {
    lookup(hostname, {...options, all: true}, (error, addresses) => {
      if (error) return callback(error)
      const list = addresses as dns.LookupAddress[]
      const inward = list.find((entry) => !isPublicAddress(entry.address))
      if (inward || list.length === 0)
        return callback(
          new DownloadRefused(
            'address',
            `${hostname} resolves to ${inward?.address ?? 'nothing'}, not a public address`,
          ),
        )
      if (options.all) return callback(null, list)
      callback(null, (list[0] as dns.LookupAddress).address, (list[0] as dns.LookupAddress).family)
    })
  }) as typeof dns.lookup
}

interface Response {
  response: http.IncomingMessage
  request: http.ClientRequest
  /** Set when the socket went idle too long (the body's stream then ends in a plain error). */
  idle?: DownloadRefused
}

function get(url: URL, origin: AllowedOrigin, options: DownloadOptions, signal: AbortSignal): Promise<Response> {
  const client = url.protocol === 'https:' ? https : http
  const idle = options.idleTimeoutMs ?? DEFAULT_IDLE_TIMEOUT_MS
  return new Promise((resolve, reject) => {
    const state: Partial<Response> = {}
    const request = client.get(url, {
      headers: {'accept-encoding': 'identity', ...origin.headers},
      signal,
      timeout: idle,
      agent: false, // one connection per file: nothing pooled that a later URL could reuse
      rejectUnauthorized: origin.verifyTls !== false,
      ...(origin.publicOnly ? {lookup: publicLookup(options.lookup ?? dns.lookup)} : {}),
    })
    request.on('timeout', () => {
      state.idle = new DownloadRefused('timeout', `nothing arrived for ${duration(idle)}`)
      request.destroy(state.idle)
    })
    request.on('response', (response) => resolve(Object.assign(state, {response, request})))
    request.on('error', (error) => reject(error))
  })
}

function describeFailure(error: unknown, signal: AbortSignal): DownloadRefused {
  if (error instanceof DownloadRefused) return error
  if (signal.reason instanceof DownloadRefused) return signal.reason
  const cause = (error as {cause?: unknown}).cause
  if (cause instanceof DownloadRefused) return cause
  // the code only: the system's words name addresses the sender has no business seeing
  return new DownloadRefused('network', `the download failed (${errorCode(error)})`)
}

/**
 * The bytes at `url`, chunk by chunk, from one of the allowed origins. Throws DownloadRefused
 * for anything not allowed, an HTTP error, a timeout or a body past `maxBytes` (checked on the
 * declared length first, then on every chunk).
 */
export async function* downloadFile(url: string, options: DownloadOptions): AsyncGenerator<Buffer> {
  const totalMs = options.totalTimeoutMs ?? DEFAULT_TOTAL_TIMEOUT_MS
  let current: URL
  try {
    current = new URL(url)
  } catch {
    throw new DownloadRefused('origin', 'the attachment has no valid URL')
  }
  const maxRedirects = options.maxRedirects ?? DEFAULT_MAX_REDIRECTS
  // our own timer, not AbortSignal.timeout: the whole download, body included, ends at it
  const controller = new AbortController()
  const signal = controller.signal
  const timer = setTimeout(
    () => controller.abort(new DownloadRefused('timeout', `the download took longer than ${duration(totalMs)}`)),
    totalMs,
  )
  const cancel = () => controller.abort(new DownloadRefused('network', 'the download was cancelled'))
  if (options.signal?.aborted) cancel()
  options.signal?.addEventListener('abort', cancel)
  let active: Response | undefined
  try {
    for (let redirects = 0; ; redirects++) {
      const origin = originFor(current, options.allowed)
      try {
        active = await get(current, origin, options, signal)
      } catch (error) {
        throw describeFailure(error, signal)
      }
      const {response} = active
      const status = response.statusCode ?? 0
      if (status >= 300 && status < 400 && response.headers.location) {
        response.resume()
        active.request.destroy()
        if (redirects >= maxRedirects) throw new DownloadRefused('redirects', `more than ${maxRedirects} redirects`)
        const next = new URL(response.headers.location, current)
        // each hop must be allowed on its own; credentials go only to the origin they belong to
        current = next
        continue
      }
      if (status < 200 || status >= 300) {
        response.resume()
        throw new DownloadRefused('http', `the server answered HTTP ${status}`, status)
      }
      const declared = Number(response.headers['content-length'])
      if (Number.isFinite(declared) && declared > options.maxBytes)
        throw new DownloadRefused('too-large', `it is ${declared} bytes`)
      options.onResponse?.(response.headers)
      break
    }
    let received = 0
    const response = active.response
    try {
      for await (const chunk of response) {
        if (signal.aborted) throw signal.reason
        received += (chunk as Buffer).length
        if (received > options.maxBytes) throw new DownloadRefused('too-large', `it is over ${options.maxBytes} bytes`)
        yield chunk as Buffer
      }
    } catch (error) {
      throw active.idle ?? describeFailure(error, signal)
    }
    if (!response.complete) throw new DownloadRefused('network', 'the server closed the connection mid-file')
  } finally {
    clearTimeout(timer)
    options.signal?.removeEventListener('abort', cancel)
    active?.request.destroy()
  }
}
