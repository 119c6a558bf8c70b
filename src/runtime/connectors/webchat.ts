import type {IncomingMessage, ServerResponse} from 'node:http'
import type {InboundMessage} from '../shapes/agent-run-contract.js'
import type {MessageDispatcher} from './types.js'
import {describeSize} from '../config/attachment-caps.js'
import {bearerToken, MAX_BODY_BYTES, readJsonObject, sendJson, type BodyExchange} from '../http/json.js'
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
  /**
   * Bytes of files that messages waiting for their run may hold, all agents together
   * (gateway.max_queued_chat_files_size); unset: no bound.
   */
  maxQueuedFileBytes?: () => number
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

interface ChatAttachment {
  name: string
  content: string
  contentType?: string
}

/**
 * `attachments: [{name, content_base64, content_type?}]` as files of the message: the agent's caps
 * (count, sizes) apply when its run receives them, as on every connector; the shape is checked here.
 */
function checkedAttachments(value: unknown): ChatAttachment[] {
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
    return {name, content, ...(contentType ? {contentType} : {})}
  })
}

/**
 * A file's bytes decoded at once (its base64 text, a third larger, is not kept) and given to the
 * run once: read, they are the workspace's, no longer the gateway's memory.
 */
function decodedFile({name, content, contentType}: ChatAttachment): IncomingFile {
  let data: Buffer | undefined = Buffer.from(content, 'base64')
  return {
    name,
    ...(contentType ? {contentType} : {}),
    declaredSize: data.length,
    async *read() {
      const bytes = data
      data = undefined
      if (bytes) yield bytes
    },
  }
}

/** What the files of one web chat request hold once decoded. */
function decodedBytes(attachments: ChatAttachment[]): number {
  return attachments.reduce((total, {content}) => total + Buffer.byteLength(content, 'base64'), 0)
}

/**
 * The bytes held by the files of web chat messages waiting for their run, all agents together: a
 * queue of 51 messages an agent, each with a body of up to 4/3 of the largest max_total_size,
 * would otherwise hold gigabytes until the gateway dies of "heap out of memory". A message that
 * would take it past the limit is refused with 429; one alone is taken while nothing else is held
 * (its body cap bounds it).
 */
class QueuedFiles {
  private held = 0

  constructor(private readonly limit: () => number) {}

  /** Holds `bytes` until the returned release (which may be called more than once); throws the 429. */
  hold(bytes: number): () => void {
    if (bytes === 0) return () => {}
    const limit = this.limit()
    if (this.held > 0 && this.held + bytes > limit)
      throw new HttpError(
        429,
        'E_BUSY',
        `the gateway already holds ${describeSize(this.held)} of files for web chat messages waiting for their run, ` +
          `and this message's ${describeSize(bytes)} would take it past its limit (${describeSize(limit)}, ` +
          'gateway.max_queued_chat_files_size): send it again once those have run (see Retry-After), or with ' +
          "smaller files; the gateway's operator can raise gateway.max_queued_chat_files_size",
        {'retry-after': '30'},
      )
    this.held += bytes
    let released = false
    return () => {
      if (released) return
      released = true
      this.held -= bytes
    }
  }
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
  const queued = new QueuedFiles(options.maxQueuedFileBytes ?? (() => Infinity))
  options.router.post(
    '/api/chat',
    async ({req, res}) => {
      if (!options.dispatcher.accepting)
        throw new HttpError(503, 'E_BUSY', 'the gateway is shutting down', {'retry-after': '30'})
      const caller = options.caller(req)
      const request = await readChatRequest({req, res}, chatBodyLimit(), options.agentIds())
      // held from here until the run starts (or the message is refused or fails)
      const release = queued.hold(request.fileBytes)
      try {
        await answerChat(options, request, caller, res, release)
      } finally {
        release()
      }
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

/** A web chat request, checked; its files are decoded when taken (takeFiles, once). */
interface ChatRequest {
  agent: string
  message: string
  channel?: string
  /** What its files hold once decoded. */
  fileBytes: number
  takeFiles(): IncomingFile[]
}

/**
 * The request's body read and checked. Only what the answer needs is kept: the parsed body, and
 * with it the files' base64 text, is gone once the files are taken.
 */
async function readChatRequest(exchange: BodyExchange, bodyLimit: number, agentIds: string[]): Promise<ChatRequest> {
  const body = await readJsonObject(exchange, bodyLimit)
  const {agent, message = '', channel} = body
  if (typeof agent !== 'string' || !agent)
    throw new HttpError(400, 'E_INPUT', 'field "agent" (the agent id) is required')
  let attachments: ChatAttachment[] | undefined = checkedAttachments(body.attachments)
  if (typeof message !== 'string' || (!message.trim() && attachments.length === 0))
    throw new HttpError(400, 'E_INPUT', 'field "message" must be a non-empty string (or send "attachments")')
  if (message.length > MAX_MESSAGE_LENGTH)
    throw new HttpError(413, 'E_INPUT', `field "message" is longer than ${MAX_MESSAGE_LENGTH} characters`)
  if (channel !== undefined && (typeof channel !== 'string' || !channel || channel.length > 200)) {
    throw new HttpError(400, 'E_INPUT', 'field "channel" must be a string of 1 to 200 characters')
  }
  if (!agentIds.includes(agent)) throw new HttpError(404, 'E_AGENT_UNKNOWN', `unknown agent "${agent}"`)
  return {
    agent,
    message,
    ...(channel === undefined ? {} : {channel: channel as string}),
    fileBytes: decodedBytes(attachments),
    takeFiles() {
      const taken = attachments ?? []
      attachments = undefined
      return taken.map(decodedFile)
    },
  }
}

/** Runs the message and answers with its reply (and the files the agent sent); `onTurn` is told when its run starts. */
async function answerChat(
  options: WebChatOptions,
  request: ChatRequest,
  caller: ChatCaller,
  res: ServerResponse,
  onTurn: () => void,
): Promise<void> {
  const {agent, message, channel} = request
  const files = request.takeFiles()
  const inbound: InboundMessage = {
    id: `web-${Date.now()}-${Math.random().toString(36).slice(2, 10)}`,
    connector: 'webchat',
    channel_id: webChatChannel(caller, channel),
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
    files.length > 0 ? {files, onTurn} : {},
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
}
