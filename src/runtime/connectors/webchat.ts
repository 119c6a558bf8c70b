import type {IncomingMessage} from 'node:http'
import type {InboundMessage} from '../shapes/agent-run-contract.js'
import type {MessageDispatcher} from './types.js'
import {bearerToken, MAX_BODY_BYTES, readJsonObject, sendJson} from '../http/json.js'
import type {IncomingFile} from './attachments.js'
import type {OutboundFile} from '../shapes/outbound-file.js'
import {HttpError, type Router} from '../http/router.js'
import type {ApiKeys} from '../state/api-keys.js'
import type {RunRecords} from '../state/run-records.js'

/** Who sends a web chat message: an API key (chat or admin) or the dashboard (`captain`). */
export interface ChatCaller {
  id: string
  name: string
}

export interface WebChatOptions {
  router: Router
  dispatcher: MessageDispatcher
  agentIds: () => string[]
  /** The caller of a request, from its bearer token; throws HttpError 401 without a valid one. */
  caller: (req: IncomingMessage) => ChatCaller
  /** The caller's own web chat runs (GET /api/chat/runs). */
  runs?: RunRecords
  /** The largest `attachments.max_total_size` of any agent, in bytes: it sizes the request body cap. */
  maxAttachmentBytes?: () => number
}

/** Callers when the dashboard is off: API keys only. */
export function apiKeyCaller(apiKeys: ApiKeys): (req: IncomingMessage) => ChatCaller {
  return (req) => {
    const key = bearerToken(req)
    const record = key ? apiKeys.verify(key) : undefined
    if (!record) {
      throw new HttpError(
        401,
        'E_AUTH',
        key ? 'unknown or revoked API key' : 'send an API key as Authorization: Bearer cptn_...',
        {
          'www-authenticate': 'Bearer realm="meepagateway"',
        },
      )
    }
    return {id: record.id, name: record.name}
  }
}

/**
 * The conversation (memory channel) of a caller's message: always inside the caller's own
 * namespace, so no key can name, read or extend another caller's history.
 */
export function webChatChannel(caller: ChatCaller, channel: string | undefined): string {
  return channel === undefined ? `api-${caller.id}` : `api-${caller.id}/${channel}`
}

function fileView(file: OutboundFile): {name: string; size: number; content_type: string; content_base64: string} {
  return {
    name: file.name,
    size: file.size,
    content_type: file.content_type,
    content_base64: file.data.toString('base64'),
  }
}

const STATUS_BY_OUTCOME = {ok: 200, failed: 502, interrupted: 503, rejected: 429} as const
const MAX_ATTACHMENT_ENTRIES = 100

/**
 * `attachments: [{name, content_base64, content_type?}]` as files of the message: the agent's caps
 * (count, sizes) apply when its run receives them, as on every connector; the shape is checked here.
 */
export function chatAttachments(value: unknown): IncomingFile[] {
  if (value === undefined) return []
  if (!Array.isArray(value) || value.length > MAX_ATTACHMENT_ENTRIES)
    throw new HttpError(
      400,
      'E_INPUT',
      `field "attachments" must be an array of at most ${MAX_ATTACHMENT_ENTRIES} files`,
    )
  return value.map((entry, index) => {
    const {name, content_base64: content, content_type: contentType} = (entry ?? {}) as Record<string, unknown>
    const field = `attachments[${index}]`
    if (typeof name !== 'string' || !name || name.length > 1000)
      throw new HttpError(400, 'E_INPUT', `${field}.name must be a file name of 1 to 1000 characters`)
    if (typeof content !== 'string' || !/^[A-Za-z0-9+/]*={0,2}$/.test(content) || content.length % 4 === 1)
      throw new HttpError(400, 'E_INPUT', `${field}.content_base64 must be the file's bytes in base64`)
    if (contentType !== undefined && typeof contentType !== 'string')
      throw new HttpError(400, 'E_INPUT', `${field}.content_type must be a string such as image/png`)
    return {
      name,
      ...(contentType ? {contentType} : {}),
      declaredSize: Buffer.byteLength(content, 'base64'),
      async *read() {
        yield Buffer.from(content, 'base64')
      },
    }
  })
}
const MAX_MESSAGE_LENGTH = 100_000

/**
 * `POST /api/chat {agent, message, channel?}` → `{reply, run_id, files?}`, authenticated with an API
 * key or the dashboard's session; `channel` names a conversation inside the caller's own. The
 * request waits for the run; a failed run answers 502 with the same short reply a chat user would
 * get, plus the error code.
 */
export function mountWebChat(options: WebChatOptions): void {
  // base64 takes 4 bytes for 3: room for the largest message's files, and the usual 1 MiB for the rest
  const chatBodyLimit = () => MAX_BODY_BYTES + Math.ceil(((options.maxAttachmentBytes?.() ?? 0) * 4) / 3)
  options.router.post(
    '/api/chat',
    async ({req, res}) => {
      if (!options.dispatcher.accepting)
        throw new HttpError(503, 'E_BUSY', 'the gateway is shutting down', {'retry-after': '30'})
      const caller = options.caller(req)
      const body = await readJsonObject({req, res}, chatBodyLimit())
      const {agent, message = '', channel} = body
      if (typeof agent !== 'string' || !agent)
        throw new HttpError(400, 'E_INPUT', 'field "agent" (the agent id) is required')
      const files = chatAttachments(body.attachments)
      if (typeof message !== 'string' || (!message.trim() && files.length === 0))
        throw new HttpError(400, 'E_INPUT', 'field "message" must be a non-empty string (or send "attachments")')
      if (message.length > MAX_MESSAGE_LENGTH)
        throw new HttpError(413, 'E_INPUT', `field "message" is longer than ${MAX_MESSAGE_LENGTH} characters`)
      if (channel !== undefined && (typeof channel !== 'string' || !channel || channel.length > 200)) {
        throw new HttpError(400, 'E_INPUT', 'field "channel" must be a string of 1 to 200 characters')
      }
      if (!options.agentIds().includes(agent)) throw new HttpError(404, 'E_AGENT_UNKNOWN', `unknown agent "${agent}"`)

      const inbound: InboundMessage = {
        id: `web-${Date.now()}-${Math.random().toString(36).slice(2, 10)}`,
        connector: 'webchat',
        channel_id: webChatChannel(caller, channel as string | undefined),
        user: {id: caller.id, name: caller.name},
        content: message,
      }
      let reply = ''
      let sentFiles: OutboundFile[] = []
      const ticket = options.dispatcher.dispatch(
        agent,
        inbound,
        {
          send: async (text) => {
            reply = text
          },
          // the answer carries the files itself: nothing the platform could refuse
          sendWithFiles: async (text, sent) => {
            reply = text
            sentFiles = sent
            return []
          },
          startTyping: () => () => {},
        },
        files.length > 0 ? {files} : {},
      )
      const outcome = await ticket.done
      const status = outcome.rejectedBecause === 'stopping' ? 503 : STATUS_BY_OUTCOME[outcome.status]
      const error =
        outcome.output && !outcome.output.ok
          ? {code: outcome.output.error.code}
          : outcome.status === 'rejected'
            ? {code: 'E_BUSY'}
            : undefined
      const toolCalls = outcome.output?.ok ? {tool_calls: outcome.output.tool_calls} : {}
      const attachments = outcome.attachments ? {attachments: outcome.attachments} : {}
      sendJson(
        res,
        status,
        {
          reply,
          run_id: outcome.runId,
          ...toolCalls,
          ...attachments,
          ...(sentFiles.length > 0 ? {files: sentFiles.map(fileView)} : {}),
          ...(error ? {error} : {}),
        },
        status === 429 ? {'retry-after': '30'} : {},
      )
    },
    {maxBodyBytes: chatBodyLimit},
  )
  const runs = options.runs
  if (runs) {
    options.router.get('/api/chat/runs', ({req, res, url}) => {
      const caller = options.caller(req)
      const limit = Math.min(Math.max(Number(url.searchParams.get('limit')) || 50, 1), 500)
      // like the reply, the list names a failure's code; its details (paths, provider errors) are the operator's
      sendJson(
        res,
        200,
        runs.listByUser('webchat', caller.id, limit).map(({error_message: _details, ...run}) => run),
      )
    })
  }
}
