import type {IncomingMessage, ServerResponse} from 'node:http'

/** An error a handler throws to answer with a status and `{error: {code, message}}`. */
export class HttpError extends Error {
  constructor(
    readonly status: number,
    readonly code: string,
    message: string,
    readonly headers: Record<string, string> = {},
  ) {
    super(message)
    this.name = 'HttpError'
  }
}

export interface RequestContext {
  req: IncomingMessage
  res: ServerResponse
  url: URL
  /** `:name` segments of the route pattern, and `*` for the rest of a prefix route. */
  params: Record<string, string>
}

export type RouteHandler = (context: RequestContext) => Promise<void> | void

interface Route {
  method: string
  segments: string[]
  /** Pattern ended in `/*`: matches any deeper path. */
  prefix: boolean
  handler: RouteHandler
  /** The largest body this route reads (default MAX_BODY_BYTES): the server refuses a larger declared one at once. */
  maxBodyBytes?: () => number
}

/**
 * Method + path routing for the gateway's one HTTP listener. Patterns are `/api/chat`,
 * `/api/runs/:id` or a prefix `/api/captain/*`; other parts of the gateway (the dashboard)
 * add their routes to the same router, so everything shares one port.
 */
export class Router {
  private readonly routes: Route[] = []

  add(method: string, pattern: string, handler: RouteHandler, options: {maxBodyBytes?: () => number} = {}): this {
    const prefix = pattern.endsWith('/*')
    const segments = splitPath(prefix ? pattern.slice(0, -2) : pattern)
    this.routes.push({method: method.toUpperCase(), segments, prefix, handler, ...options})
    return this
  }

  get(pattern: string, handler: RouteHandler): this {
    return this.add('GET', pattern, handler)
  }

  post(pattern: string, handler: RouteHandler, options: {maxBodyBytes?: () => number} = {}): this {
    return this.add('POST', pattern, handler, options)
  }

  /** The handler for a request, or the methods the path allows when only the method is wrong. */
  match(
    method: string,
    pathname: string,
  ):
    | {handler: RouteHandler; params: Record<string, string>; maxBodyBytes?: () => number}
    | {allowed: string[]}
    | undefined {
    const segments = splitPath(pathname)
    const allowed = new Set<string>()
    for (const route of this.routes) {
      const params = matchSegments(route, segments)
      if (!params) continue
      if (route.method === method.toUpperCase() || (route.method === 'GET' && method.toUpperCase() === 'HEAD')) {
        return {handler: route.handler, params, ...(route.maxBodyBytes ? {maxBodyBytes: route.maxBodyBytes} : {})}
      }
      allowed.add(route.method)
    }
    return allowed.size > 0 ? {allowed: [...allowed]} : undefined
  }
}

function splitPath(pathname: string): string[] {
  return pathname.split('/').filter(Boolean)
}

function matchSegments(route: Route, segments: string[]): Record<string, string> | undefined {
  if (route.prefix ? segments.length < route.segments.length : segments.length !== route.segments.length)
    return undefined
  const params: Record<string, string> = {}
  for (const [index, part] of route.segments.entries()) {
    const actual = segments[index] as string
    if (part.startsWith(':')) {
      try {
        params[part.slice(1)] = decodeURIComponent(actual)
      } catch {
        return undefined
      }
    } else if (part !== actual) return undefined
  }
  if (route.prefix) params['*'] = segments.slice(route.segments.length).join('/')
  return params
}
