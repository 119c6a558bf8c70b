import type {IncomingMessage} from 'node:http'
import type {InboundMessage} from '../agent-run/contract.js'
import type {Dispatcher} from '../gateway/dispatcher.js'
import {bearerToken, readJsonObject, sendJson} from '../http/json.js'
import {HttpError, type Router} from '../http/router.js'
import type {ApiKeys} from '../state/api-keys.js'

export interface WebChatOptions {
  router: Router
  apiKeys: ApiKeys
  dispatcher: Dispatcher
  agentIds: () => string[]
  /**
   * Other credentials than an API key (the dashboard's session cookie + CSRF token): returns the
   * caller, undefined when the request carries none, or throws HttpError for bad ones.
   */
  sessionCaller?: (req: IncomingMessage) => {id: string; name: string} | undefined
}

const STATUS_BY_OUTCOME = {ok: 200, failed: 502, interrupted: 503, rejected: 429} as const
const MAX_MESSAGE_LENGTH = 100_000

/**
 * `POST /api/chat {agent, message, channel?}` → `{reply, run_id}`, authenticated with an API
 * key. The request waits for the run; a failed run answers 502 with the same short reply a
 * chat user would get, plus the error code.
 */
export function mountWebChat(options: WebChatOptions): void {
  options.router.post('/api/chat', async ({req, res}) => {
    if (!options.dispatcher.accepting) throw new HttpError(503, 'E_BUSY', 'the gateway is shutting down', {'retry-after': '30'})
    const key = bearerToken(req)
    const caller = key ? options.apiKeys.verify(key) : options.sessionCaller?.(req)
    if (!caller) {
      throw new HttpError(401, 'E_AUTH', key ? 'unknown or revoked API key' : 'send an API key as Authorization: Bearer cptn_...', {
        'www-authenticate': 'Bearer realm="meepagateway"',
      })
    }
    const body = await readJsonObject(req)
    const {agent, message, channel} = body
    if (typeof agent !== 'string' || !agent) throw new HttpError(400, 'E_INPUT', 'field "agent" (the agent id) is required')
    if (typeof message !== 'string' || !message.trim()) throw new HttpError(400, 'E_INPUT', 'field "message" must be a non-empty string')
    if (message.length > MAX_MESSAGE_LENGTH) throw new HttpError(413, 'E_INPUT', `field "message" is longer than ${MAX_MESSAGE_LENGTH} characters`)
    if (channel !== undefined && (typeof channel !== 'string' || !channel || channel.length > 200)) {
      throw new HttpError(400, 'E_INPUT', 'field "channel" must be a string of 1 to 200 characters')
    }
    if (!options.agentIds().includes(agent)) throw new HttpError(404, 'E_AGENT_UNKNOWN', `unknown agent "${agent}"`)

    const inbound: InboundMessage = {
      id: `web-${Date.now()}-${Math.random().toString(36).slice(2, 10)}`,
      connector: 'webchat',
      // each key talks in its own conversation unless the caller names a channel
      channel_id: typeof channel === 'string' ? channel : `api-${caller.id}`,
      user: {id: caller.id, name: caller.name},
      content: message,
    }
    let reply = ''
    const ticket = options.dispatcher.dispatch(agent, inbound, {
      send: async (text) => {
        reply = text
      },
      startTyping: () => () => {},
    })
    const outcome = await ticket.done
    const status = outcome.rejectedBecause === 'stopping' ? 503 : STATUS_BY_OUTCOME[outcome.status]
    const error = outcome.output && !outcome.output.ok ? {code: outcome.output.error.code} : outcome.status === 'rejected' ? {code: 'E_BUSY'} : undefined
    const toolCalls = outcome.output?.ok ? {tool_calls: outcome.output.tool_calls} : {}
    sendJson(res, status, {reply, run_id: outcome.runId, ...toolCalls, ...(error ? {error} : {})}, status === 429 ? {'retry-after': '30'} : {})
  })
}
