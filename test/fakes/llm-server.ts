/**
 * A fake LLM server on 127.0.0.1 that speaks the OpenAI Chat Completions and the Anthropic
 * Messages wire formats well enough for the official SDKs: JSON and SSE streaming, tool calls,
 * usage, and errors in each API's own error shape.
 *
 * The agent loop runs in a child process, so the script lives here in the server:
 *
 *   const llm = await startFakeLlm()
 *   llm.enqueue({toolCalls: [{name: 'write_file', arguments: {path: 'a.txt', content: 'hi'}}]}, {text: 'done'})
 *   // provider config: {kind: 'openai', base_url: llm.openaiBaseUrl}
 *   //               or {kind: 'anthropic', base_url: llm.anthropicBaseUrl}
 *   ...
 *   expect(llm.requests).toHaveLength(2)
 *   await llm.close()
 *
 * Benchmarks and manual runs can start it as its own process, answering every request at once:
 *   npx tsx test/fakes/llm-server.ts [--text ok]   (prints {"openaiBaseUrl", "anthropicBaseUrl"} as one JSON line)
 *
 * One queue serves both APIs, in arrival order. When it is empty the server answers the default
 * turn (`setDefault`), or else HTTP 500 "fake LLM: no scripted response".
 *
 * Like the real APIs, a request whose tool calls and tool results do not pair up is refused with
 * HTTP 400 (and consumes no turn), so a conversion bug fails the test that caused it.
 */
import {createServer, type IncomingMessage, type ServerResponse} from 'node:http'
import {pathToFileURL} from 'node:url'
import {closeFakeServer, listenOnLoopback, readBody, sendJson} from './fake-http.js'

export type FakeApi = 'openai' | 'anthropic'

export interface FakeRequest {
  api: FakeApi
  method: string
  path: string
  /** Lower-case header names. */
  headers: Record<string, string>
  /** The parsed JSON body. */
  body: any
  stream: boolean
  /** Date.now() when the request arrived. */
  time: number
}

export interface FakeToolCall {
  name: string
  /** An object is sent as JSON; a string is sent as is (to script malformed arguments). */
  arguments: Record<string, unknown> | string
  id?: string
}

interface TurnOptions {
  /** Wait this long before answering (the client may give up first). */
  delayMs?: number
  usage?: {input_tokens?: number; output_tokens?: number}
  /** Overrides finish_reason / stop_reason. */
  stopReason?: string
  /**
   * Fail after the answer has started: a streamed answer breaks off with the API's in-stream error
   * event (Anthropic's overloaded_error, OpenAI's error chunk); a plain one gets HTTP 529 / 500.
   */
  streamError?: string
  /**
   * An answer that never completes: `truncate` stops before the API's terminal event (a streamed
   * answer loses finish_reason/[DONE] or message_delta/message_stop; a plain one half its JSON body),
   * `garbage` answers 200 with a body that is neither JSON nor SSE, `stall` sends the first part
   * and then nothing for `stallMs` (default 60 s) before ending like `truncate`.
   */
  incomplete?: 'truncate' | 'garbage' | 'stall'
  stallMs?: number
}

export type ScriptedTurn = TurnOptions &
  (
    | {text: string; toolCalls?: FakeToolCall[]}
    | {toolCalls: FakeToolCall[]; text?: string}
    /** An error response; `body` replaces the API's error object, `message` goes inside the generated one. */
    | {status: number; body?: object; message?: string; headers?: Record<string, string>}
    /** Drops the connection without an answer. */
    | {disconnect: true}
  )

export type FakeTurn = ScriptedTurn | ((request: FakeRequest) => ScriptedTurn | Promise<ScriptedTurn>)

export interface FakeLlmOptions {
  /** Refuse (400) requests whose tool calls and results do not pair up, as the real APIs do. Default true. */
  validate?: boolean
}

export interface FakeLlm {
  /** For `kind: openai` (ends in /v1, as OpenAI-compatible base URLs do). */
  readonly openaiBaseUrl: string
  /** For `kind: anthropic` (the SDK appends /v1/messages). */
  readonly anthropicBaseUrl: string
  readonly port: number
  /** Every request received, in order, including refused ones. */
  readonly requests: FakeRequest[]
  /**
   * When each answer took place (performance.now(): its request's first byte, its answer's last):
   * the time a caller waited on this provider (a benchmark subtracts it).
   */
  readonly served: Array<{receivedMs: number; answeredMs: number}>
  /** Turns still queued. */
  readonly pending: number
  enqueue(...turns: FakeTurn[]): void
  /** The answer when the queue is empty; undefined restores the 500. */
  setDefault(turn: FakeTurn | undefined): void
  /** Answer 401 in the API's error shape unless the request carries this key; undefined accepts any. */
  requireApiKey(key: string | undefined): void
  /** Empties the queue and the request log and forgets the default and the key. */
  reset(): void
  close(): Promise<void>
}

export async function startFakeLlm(options: FakeLlmOptions = {}): Promise<FakeLlm> {
  const validate = options.validate ?? true
  const queue: FakeTurn[] = []
  const requests: FakeRequest[] = []
  const served: Array<{receivedMs: number; answeredMs: number}> = []
  let defaultTurn: FakeTurn | undefined
  let apiKey: string | undefined
  let counter = 0

  const server = createServer((req, res) => {
    const receivedMs = performance.now()
    res.once('finish', () => served.push({receivedMs, answeredMs: performance.now()}))
    handle(req, res).catch((error: unknown) => {
      if (!res.headersSent)
        sendJson(res, 500, {error: {message: `fake LLM crashed: ${String(error)}`, type: 'server_error'}})
      else res.destroy()
    })
  })

  async function handle(req: IncomingMessage, res: ServerResponse): Promise<void> {
    const path = (req.url ?? '/').split('?')[0]
    const api: FakeApi | undefined =
      req.method === 'POST' && path === '/v1/chat/completions'
        ? 'openai'
        : req.method === 'POST' && path === '/v1/messages'
          ? 'anthropic'
          : undefined
    const raw = await readBody(req)
    if (!api) {
      sendJson(res, 404, {error: {message: `fake LLM: no route ${req.method} ${path}`, type: 'not_found_error'}})
      return
    }
    let body: any
    try {
      body = JSON.parse(raw)
    } catch {
      sendError(res, api, 400, 'fake LLM: the body is not valid JSON')
      return
    }
    const request: FakeRequest = {
      api,
      method: req.method ?? 'POST',
      path,
      headers: Object.fromEntries(
        Object.entries(req.headers).map(([name, value]) => [
          name,
          Array.isArray(value) ? value.join(', ') : (value ?? ''),
        ]),
      ),
      body,
      stream: body?.stream === true,
      time: Date.now(),
    }
    requests.push(request)

    if (apiKey !== undefined && presentedKey(request) !== apiKey) {
      sendError(res, api, 401, api === 'openai' ? 'Incorrect API key provided.' : 'invalid x-api-key')
      return
    }
    const problem = validate ? (api === 'openai' ? openaiProblem(body) : anthropicProblem(body)) : undefined
    if (problem) {
      sendError(res, api, 400, problem)
      return
    }

    const next = queue.shift() ?? defaultTurn
    if (!next) {
      sendError(res, api, 500, 'fake LLM: no scripted response')
      return
    }
    const turn = typeof next === 'function' ? await next(request) : next
    if (turn.delayMs) {
      const gone = await waitOrClientGone(turn.delayMs, res)
      if (gone) return
    }
    if ('disconnect' in turn) {
      req.socket.destroy()
      return
    }
    if ('status' in turn) {
      sendError(
        res,
        api,
        turn.status,
        turn.message ?? `fake LLM: scripted HTTP ${turn.status}`,
        turn.body,
        turn.headers,
      )
      return
    }
    if (turn.incomplete === 'garbage') {
      res.writeHead(200, {'content-type': request.stream ? 'text/event-stream' : 'application/json'})
      res.end('<html>502 upstream hiccup</html>\n}{ not json at all\n\n')
      return
    }
    if (turn.streamError && !request.stream) {
      sendError(res, api, api === 'anthropic' ? 529 : 500, turn.streamError)
      return
    }
    counter++
    const answer = {
      text: turn.text ?? '',
      toolCalls: (turn.toolCalls ?? []).map((call, index) => ({
        id: call.id ?? (api === 'openai' ? `call_${counter}_${index}` : `toolu_${counter}_${index}`),
        name: call.name,
        argumentsJson: typeof call.arguments === 'string' ? call.arguments : JSON.stringify(call.arguments),
      })),
      usage: {
        input_tokens: turn.usage?.input_tokens ?? Math.ceil(raw.length / 4),
        output_tokens: turn.usage?.output_tokens ?? Math.ceil((turn.text ?? '').length / 4) + 1,
      },
      stopReason: turn.stopReason,
      streamError: turn.streamError,
      incomplete: turn.incomplete,
      stallMs: turn.stallMs ?? 60_000,
      id: counter,
      model: typeof body.model === 'string' ? body.model : 'fake-model',
    }
    if (answer.incomplete && !request.stream) {
      const full = JSON.stringify(api === 'openai' ? openAiCompletion(answer) : anthropicMessage(answer))
      res.writeHead(200, {'content-type': 'application/json'})
      res.write(full.slice(0, Math.floor(full.length / 2)))
      if (answer.incomplete === 'stall' && (await waitOrClientGone(answer.stallMs, res))) return
      res.end()
      return
    }
    if (api === 'openai') {
      if (request.stream) await streamOpenAi(res, answer, body.stream_options?.include_usage === true)
      else sendJson(res, 200, openAiCompletion(answer), {'x-request-id': `req_${counter}`})
    } else if (request.stream) {
      await streamAnthropic(res, answer)
    } else {
      sendJson(res, 200, anthropicMessage(answer), {'request-id': `req_${counter}`})
    }
  }

  const port = await listenOnLoopback(server)
  const origin = `http://127.0.0.1:${port}`

  return {
    openaiBaseUrl: `${origin}/v1`,
    anthropicBaseUrl: origin,
    port,
    requests,
    served,
    get pending() {
      return queue.length
    },
    enqueue: (...turns) => void queue.push(...turns),
    setDefault: (turn) => void (defaultTurn = turn),
    requireApiKey: (key) => void (apiKey = key),
    reset() {
      queue.length = 0
      requests.length = 0
      served.length = 0
      defaultTurn = undefined
      apiKey = undefined
    },
    close: () => closeFakeServer(server),
  }
}

interface Answer {
  text: string
  toolCalls: Array<{id: string; name: string; argumentsJson: string}>
  usage: {input_tokens: number; output_tokens: number}
  stopReason?: string
  streamError?: string
  incomplete?: 'truncate' | 'garbage' | 'stall'
  stallMs: number
  id: number
  model: string
}

// ---------------------------------------------------------------- OpenAI Chat Completions

function openAiCompletion(answer: Answer): object {
  return {
    id: `chatcmpl-${answer.id}`,
    object: 'chat.completion',
    created: Math.floor(Date.now() / 1000),
    model: answer.model,
    system_fingerprint: null,
    choices: [
      {
        index: 0,
        message: {
          role: 'assistant',
          content: answer.text === '' && answer.toolCalls.length > 0 ? null : answer.text,
          refusal: null,
          ...(answer.toolCalls.length > 0
            ? {
                tool_calls: answer.toolCalls.map((call) => ({
                  id: call.id,
                  type: 'function',
                  function: {name: call.name, arguments: call.argumentsJson},
                })),
              }
            : {}),
        },
        logprobs: null,
        finish_reason: openAiFinishReason(answer),
      },
    ],
    usage: openAiUsage(answer),
  }
}

function openAiFinishReason(answer: Answer): string {
  return answer.stopReason ?? (answer.toolCalls.length > 0 ? 'tool_calls' : 'stop')
}

function openAiUsage(answer: Answer): object {
  const {input_tokens: prompt, output_tokens: completion} = answer.usage
  return {prompt_tokens: prompt, completion_tokens: completion, total_tokens: prompt + completion}
}

/** Text and tool arguments are sent in several pieces so clients must really assemble them. */
/**
 * For `incomplete`: after the first part, either stop (truncate) or wait, then stop (stall).
 * Resolves true when the answer must end here.
 */
async function cutShort(res: ServerResponse, answer: Answer): Promise<boolean> {
  if (!answer.incomplete) return false
  if (answer.incomplete === 'stall') await waitOrClientGone(answer.stallMs, res)
  res.end()
  return true
}

async function streamOpenAi(res: ServerResponse, answer: Answer, includeUsage: boolean): Promise<void> {
  startSse(res)
  const base = {
    id: `chatcmpl-${answer.id}`,
    object: 'chat.completion.chunk',
    created: Math.floor(Date.now() / 1000),
    model: answer.model,
    system_fingerprint: null,
  }
  const chunk = (delta: object, finishReason: string | null = null, extra: object = {}) =>
    writeSse(res, undefined, {
      ...base,
      choices: [{index: 0, delta, logprobs: null, finish_reason: finishReason}],
      ...extra,
    })

  chunk({role: 'assistant', content: '', refusal: null})
  if (answer.streamError) {
    writeSse(res, undefined, {error: {message: answer.streamError, type: 'server_error', param: null, code: null}})
    res.end()
    return
  }
  for (const piece of pieces(answer.text)) chunk({content: piece})
  if (await cutShort(res, answer)) return
  answer.toolCalls.forEach((call, index) => {
    chunk({tool_calls: [{index, id: call.id, type: 'function', function: {name: call.name, arguments: ''}}]})
    for (const piece of pieces(call.argumentsJson)) chunk({tool_calls: [{index, function: {arguments: piece}}]})
  })
  chunk({}, openAiFinishReason(answer))
  if (includeUsage) writeSse(res, undefined, {...base, choices: [], usage: openAiUsage(answer)})
  res.end('data: [DONE]\n\n')
}

/** What the real API refuses: tool results that answer no call, and calls left unanswered. */
function openaiProblem(body: any): string | undefined {
  if (typeof body?.model !== 'string') return 'you must provide a model parameter'
  if (!Array.isArray(body.messages) || body.messages.length === 0) return "'messages' must be a non-empty array"
  let open = new Set<string>()
  for (const [index, message] of body.messages.entries()) {
    if (message.role === 'tool') {
      if (!open.delete(message.tool_call_id)) {
        return `Invalid parameter: messages with role 'tool' must be a response to a preceeding message with 'tool_calls' (messages[${index}])`
      }
      continue
    }
    if (open.size > 0) {
      return `An assistant message with 'tool_calls' must be followed by tool messages responding to each 'tool_call_id'. The following tool_call_ids did not have response messages: ${[...open].join(', ')}`
    }
    open = new Set(
      (message.role === 'assistant' ? (message.tool_calls ?? []) : []).map((call: {id: string}) => call.id),
    )
  }
  return undefined
}

// ---------------------------------------------------------------- Anthropic Messages

function anthropicContent(answer: Answer): object[] {
  return [
    ...(answer.text ? [{type: 'text', text: answer.text}] : []),
    ...answer.toolCalls.map((call) => ({
      type: 'tool_use',
      id: call.id,
      name: call.name,
      input: parseOrRaw(call.argumentsJson),
    })),
  ]
}

/** The real API always sends an object; a scripted malformed string is passed through to test the client. */
function parseOrRaw(json: string): unknown {
  try {
    return JSON.parse(json)
  } catch {
    return json
  }
}

function anthropicStopReason(answer: Answer): string {
  return answer.stopReason ?? (answer.toolCalls.length > 0 ? 'tool_use' : 'end_turn')
}

function anthropicMessage(answer: Answer): object {
  return {
    id: `msg_${answer.id}`,
    type: 'message',
    role: 'assistant',
    model: answer.model,
    content: anthropicContent(answer),
    stop_reason: anthropicStopReason(answer),
    stop_sequence: null,
    usage: {
      input_tokens: answer.usage.input_tokens,
      output_tokens: answer.usage.output_tokens,
      cache_creation_input_tokens: 0,
      cache_read_input_tokens: 0,
    },
  }
}

async function streamAnthropic(res: ServerResponse, answer: Answer): Promise<void> {
  startSse(res)
  const event = (type: string, data: object) => writeSse(res, type, {type, ...data})
  event('message_start', {
    message: {
      id: `msg_${answer.id}`,
      type: 'message',
      role: 'assistant',
      model: answer.model,
      content: [],
      stop_reason: null,
      stop_sequence: null,
      usage: {
        input_tokens: answer.usage.input_tokens,
        output_tokens: 1,
        cache_creation_input_tokens: 0,
        cache_read_input_tokens: 0,
      },
    },
  })
  event('ping', {})
  if (answer.streamError) {
    event('error', {error: {type: 'overloaded_error', message: answer.streamError}})
    res.end()
    return
  }
  let index = 0
  if (answer.text) {
    event('content_block_start', {index, content_block: {type: 'text', text: ''}})
    for (const piece of pieces(answer.text))
      event('content_block_delta', {index, delta: {type: 'text_delta', text: piece}})
    event('content_block_stop', {index})
    index++
  }
  if (await cutShort(res, answer)) return
  for (const call of answer.toolCalls) {
    event('content_block_start', {index, content_block: {type: 'tool_use', id: call.id, name: call.name, input: {}}})
    for (const piece of pieces(call.argumentsJson))
      event('content_block_delta', {index, delta: {type: 'input_json_delta', partial_json: piece}})
    event('content_block_stop', {index})
    index++
  }
  event('message_delta', {
    delta: {stop_reason: anthropicStopReason(answer), stop_sequence: null},
    usage: {output_tokens: answer.usage.output_tokens},
  })
  event('message_stop', {})
  res.end()
}

/** What the real API refuses: tool_result blocks without their tool_use, and tool_use left unanswered. */
function anthropicProblem(body: any): string | undefined {
  if (typeof body?.model !== 'string') return 'model: Field required'
  if (typeof body.max_tokens !== 'number') return 'max_tokens: Field required'
  if (!Array.isArray(body.messages) || body.messages.length === 0) return 'messages: at least one message is required'
  let open = new Set<string>()
  for (const [index, message] of body.messages.entries()) {
    if (message.role !== 'user' && message.role !== 'assistant')
      return `messages.${index}.role: Input should be 'user' or 'assistant'`
    const blocks: any[] =
      typeof message.content === 'string' ? [{type: 'text', text: message.content}] : (message.content ?? [])
    if (blocks.length === 0) return `messages.${index}: all messages must have non-empty content`
    for (const block of blocks) {
      if (block.type === 'text' && block.text === '') return `messages.${index}: text content blocks must be non-empty`
      if (block.type === 'tool_result' && !open.delete(block.tool_use_id)) {
        return `messages.${index}.content: unexpected \`tool_use_id\` found in \`tool_result\` blocks: ${block.tool_use_id}. Each \`tool_result\` block must have a corresponding \`tool_use\` block in the previous message.`
      }
    }
    if (open.size > 0) {
      return `messages.${index}: \`tool_use\` ids were found without \`tool_result\` blocks immediately after: ${[...open].join(', ')}. Each \`tool_use\` block must have a corresponding \`tool_result\` block in the next message.`
    }
    open = new Set(
      message.role === 'assistant' ? blocks.filter((block) => block.type === 'tool_use').map((block) => block.id) : [],
    )
  }
  return undefined
}

// ---------------------------------------------------------------- shared plumbing

/** The API key a request carries. Anthropic takes `x-api-key`; its SDK 1.x sends `Authorization: Bearer`. */
export function presentedKey(request: FakeRequest): string | undefined {
  const bearer = request.headers.authorization?.replace(/^Bearer\s+/i, '')
  return request.api === 'anthropic' ? (request.headers['x-api-key'] ?? bearer) : bearer
}

const ANTHROPIC_ERROR_TYPES: Record<number, string> = {
  400: 'invalid_request_error',
  401: 'authentication_error',
  403: 'permission_error',
  404: 'not_found_error',
  413: 'request_too_large',
  429: 'rate_limit_error',
  500: 'api_error',
  529: 'overloaded_error',
}

/** Each API's own error envelope, so the SDKs build their typed errors from it. */
function sendError(
  res: ServerResponse,
  api: FakeApi,
  status: number,
  message: string,
  body?: object,
  headers: Record<string, string> = {},
): void {
  if (api === 'anthropic') {
    const type = ANTHROPIC_ERROR_TYPES[status] ?? (status >= 500 ? 'api_error' : 'invalid_request_error')
    sendJson(res, status, body ?? {type: 'error', error: {type, message}}, {
      'request-id': `req_err_${status}`,
      ...headers,
    })
  } else {
    const type = status === 429 ? 'requests' : status >= 500 ? 'server_error' : 'invalid_request_error'
    const code = status === 401 ? 'invalid_api_key' : status === 429 ? 'rate_limit_exceeded' : null
    sendJson(res, status, body ?? {error: {message, type, param: null, code}}, {
      'x-request-id': `req_err_${status}`,
      ...headers,
    })
  }
}

function startSse(res: ServerResponse): void {
  res.writeHead(200, {
    'content-type': 'text/event-stream; charset=utf-8',
    'cache-control': 'no-cache',
    connection: 'keep-alive',
  })
}

function writeSse(res: ServerResponse, event: string | undefined, data: object): void {
  if (res.destroyed) return
  res.write(`${event ? `event: ${event}\n` : ''}data: ${JSON.stringify(data)}\n\n`)
}

/** Splits text into up to three pieces (none for the empty string). */
function pieces(text: string): string[] {
  if (text === '') return []
  const size = Math.max(1, Math.ceil(text.length / 3))
  const result: string[] = []
  for (let start = 0; start < text.length; start += size) result.push(text.slice(start, start + size))
  return result
}

/** Resolves true when the client hung up before the delay ran out. */
function waitOrClientGone(ms: number, res: ServerResponse): Promise<boolean> {
  return new Promise((resolve) => {
    const timer = setTimeout(() => {
      res.off('close', onClose)
      resolve(false)
    }, ms)
    const onClose = () => {
      clearTimeout(timer)
      resolve(true)
    }
    res.once('close', onClose)
  })
}

/** Standalone: answer every request with one text until stdin closes or a signal arrives. */
async function main(argv: string[]): Promise<void> {
  const textFlag = argv.indexOf('--text')
  const llm = await startFakeLlm()
  llm.setDefault({text: textFlag === -1 ? 'ok' : (argv[textFlag + 1] ?? 'ok')})
  process.stdout.write(
    `${JSON.stringify({openaiBaseUrl: llm.openaiBaseUrl, anthropicBaseUrl: llm.anthropicBaseUrl})}\n`,
  )
  const stop = () => void llm.close().then(() => process.exit(0))
  process.once('SIGTERM', stop)
  process.once('SIGINT', stop)
  process.stdin.once('end', stop)
  process.stdin.resume()
}

if (process.argv[1] && import.meta.url === pathToFileURL(process.argv[1]).href) {
  main(process.argv.slice(2)).catch((error: unknown) => {
    process.stderr.write(`fake LLM: ${String(error)}\n`)
    process.exit(1)
  })
}
