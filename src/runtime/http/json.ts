import type {IncomingMessage, ServerResponse} from 'node:http'
import {HttpError} from './router.js'

const DEFAULT_BODY_LIMIT = 1024 * 1024
/** Deeper bodies are refused: nothing the gateway accepts nests this far, and recursion over them could overflow. */
const MAX_JSON_DEPTH = 32

export function sendJson(res: ServerResponse, status: number, body: unknown, headers: Record<string, string> = {}): void {
  const text = JSON.stringify(body)
  res.writeHead(status, {
    'content-type': 'application/json; charset=utf-8',
    'content-length': String(Buffer.byteLength(text)),
    'cache-control': 'no-store',
    ...headers,
  })
  res.end(text)
}

export function sendError(res: ServerResponse, error: HttpError): void {
  sendJson(res, error.status, {error: {code: error.code, message: error.message}}, error.headers)
}

/**
 * The request body parsed as a JSON object; a clear 400/413/415 otherwise. Only
 * `Content-Type: application/json` is read: a cross-site form or a body without a type (which a
 * browser sends without asking the server first) is refused before anything is parsed.
 */
export async function readJsonObject(req: IncomingMessage, limit = DEFAULT_BODY_LIMIT): Promise<Record<string, unknown>> {
  const type = req.headers['content-type'] ?? ''
  if (!/^application\/json\s*(;|$)/i.test(type)) {
    throw new HttpError(415, 'E_INPUT', 'send the body as JSON with Content-Type: application/json')
  }
  const chunks: Buffer[] = []
  let size = 0
  for await (const chunk of req) {
    size += (chunk as Buffer).length
    if (size > limit) throw new HttpError(413, 'E_INPUT', `the request body is larger than ${limit} bytes`)
    chunks.push(chunk as Buffer)
  }
  let parsed: unknown
  try {
    parsed = JSON.parse(Buffer.concat(chunks).toString('utf8'))
  } catch {
    throw new HttpError(400, 'E_INPUT', 'the request body is not valid JSON')
  }
  if (!parsed || typeof parsed !== 'object' || Array.isArray(parsed)) {
    throw new HttpError(400, 'E_INPUT', 'the request body must be a JSON object')
  }
  if (jsonDepth(parsed) > MAX_JSON_DEPTH) throw new HttpError(400, 'E_INPUT', `the request body nests deeper than ${MAX_JSON_DEPTH} levels`)
  return parsed as Record<string, unknown>
}

/** Nesting depth of parsed JSON, without recursion (so a deep body cannot overflow the stack). */
export function jsonDepth(value: unknown): number {
  let deepest = 0
  const stack: Array<[unknown, number]> = [[value, 1]]
  while (stack.length > 0) {
    const [item, depth] = stack.pop() as [unknown, number]
    if (!item || typeof item !== 'object') continue
    deepest = Math.max(deepest, depth)
    if (deepest > MAX_JSON_DEPTH) return deepest
    for (const child of Object.values(item)) stack.push([child, depth + 1])
  }
  return deepest
}

/** The token of an `Authorization: Bearer <token>` header, if any. */
export function bearerToken(req: IncomingMessage): string | undefined {
  const header = req.headers.authorization
  const match = header ? /^Bearer\s+(\S+)\s*$/i.exec(header) : null
  return match ? match[1] : undefined
}
