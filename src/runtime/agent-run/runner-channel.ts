import {GatewayError} from '../util/errors.js'
import type {ChatRequest, ChatResponse} from '../shapes/provider-types.js'
import {FrameError, LineSplitter, MAX_FRAME_BYTES, parseLlmResponseFrame, type AgentRunFrame} from './channel.js'
import {MAX_INPUT_BYTES} from './input.js'

/** Longest go line read before the input (workspace-changes.ts): a mode and a run id. */
const MAX_GO_LINE_BYTES = 320

/**
 * agent-run's stdin: first the input (one JSON value; by hand it may span lines), then, in channel
 * mode, the runner's llm_response frames until EOF. On a sync engine a go line comes before the input.
 */
export class StdinReader {
  /** The go line, when one was asked for; rejected when stdin ends or runs on without one. */
  readonly goLine: Promise<string>
  private awaitingGoLine: boolean
  private resolveGoLine!: (line: string) => void
  private rejectGoLine!: (error: Error) => void
  private readonly inputChunks: Buffer[] = []
  private inputBytes = 0
  private inputDone = false
  private frames: LineSplitter | undefined
  private resolveInput!: (text: string) => void
  private rejectInput!: (error: Error) => void
  readonly input: Promise<string>
  /** What arrives after the input before a channel is attached waits here, in order. */
  private queued: Array<() => void> = []
  /** stdin has ended (or failed). */
  private ended = false
  private handlers: {frame(line: string): void; end(): void; broken(error: FrameError): void} | undefined

  constructor(
    private readonly stream: NodeJS.ReadableStream,
    options: {goLine?: boolean} = {},
  ) {
    this.input = new Promise((resolve, reject) => {
      this.resolveInput = resolve
      this.rejectInput = reject
    })
    this.awaitingGoLine = options.goLine === true
    this.goLine = new Promise((resolve, reject) => {
      this.resolveGoLine = resolve
      this.rejectGoLine = reject
    })
    this.goLine.catch(() => {}) // awaited only when asked for
    stream.on('data', (chunk: Buffer) => this.push(chunk))
    stream.on('end', () => this.end())
    stream.on('error', () => this.end())
  }

  private push(chunk: Buffer): void {
    if (this.frames) return this.pushFrames(chunk)
    if (this.awaitingGoLine) {
      const newline = chunk.indexOf(10)
      const held = this.inputBytes + (newline === -1 ? chunk.length : newline)
      if (held > MAX_GO_LINE_BYTES) return this.failGoLine('the go line before the input is too long')
      if (newline === -1) {
        this.inputChunks.push(chunk)
        this.inputBytes += chunk.length
        return
      }
      this.awaitingGoLine = false
      this.resolveGoLine(Buffer.concat([...this.inputChunks, chunk.subarray(0, newline)]).toString('utf8'))
      this.inputChunks.length = 0
      this.inputBytes = 0
      chunk = chunk.subarray(newline + 1)
      if (chunk.length === 0) return
    }
    for (let newline = chunk.indexOf(10); newline !== -1; newline = chunk.indexOf(10, newline + 1)) {
      const head = Buffer.concat([...this.inputChunks, chunk.subarray(0, newline)]).toString('utf8')
      if (!head.trimEnd().endsWith('}')) continue
      try {
        JSON.parse(head)
      } catch {
        continue
      }
      this.inputDone = true
      this.inputChunks.length = 0
      this.frames = new LineSplitter(MAX_FRAME_BYTES, (line) => this.deliver((handlers) => handlers.frame(line)))
      this.resolveInput(head)
      this.pushFrames(chunk.subarray(newline + 1))
      return
    }
    this.inputBytes += chunk.length
    if (this.inputBytes > MAX_INPUT_BYTES) {
      this.inputDone = true
      this.stream.removeAllListeners('data')
      this.rejectInput(new GatewayError('E_INPUT', `stdin is larger than ${MAX_INPUT_BYTES} bytes`))
      return
    }
    this.inputChunks.push(chunk)
  }

  private pushFrames(chunk: Buffer): void {
    try {
      this.frames!.push(chunk)
    } catch (error) {
      this.stream.removeAllListeners('data')
      this.deliver((handlers) => handlers.broken(error as FrameError))
    }
  }

  /** Where the lines after the input go, and what EOF means (channel mode); queued events are delivered now. */
  attach(handlers: {frame(line: string): void; end(): void; broken(error: FrameError): void}): void {
    this.handlers = handlers
    for (const event of this.queued.splice(0)) event()
  }

  /**
   * Resolves at the next line from the runner, stdin's end, or after `ms`, whichever comes first;
   * what the run's channel was told is no longer heard (the run has ended).
   */
  nextLineOrEnd(ms: number): Promise<void> {
    if (this.ended) return Promise.resolve()
    return new Promise((resolve) => {
      const timer = setTimeout(resolve, ms)
      const done = () => {
        clearTimeout(timer)
        resolve()
      }
      this.attach({frame: done, end: done, broken: done})
    })
  }

  private deliver(event: (handlers: NonNullable<StdinReader['handlers']>) => void): void {
    if (this.handlers) event(this.handlers)
    else this.queued.push(() => event(this.handlers!))
  }

  private failGoLine(reason: string): void {
    this.awaitingGoLine = false
    this.inputDone = true
    this.stream.removeAllListeners('data')
    const error = new GatewayError('E_INPUT', reason)
    this.rejectGoLine(error) // the input is never awaited after it
  }

  private end(): void {
    this.ended = true
    if (this.awaitingGoLine) return this.failGoLine('stdin ended before the go line')
    if (!this.inputDone) {
      this.inputDone = true
      this.resolveInput(Buffer.concat(this.inputChunks).toString('utf8'))
      return
    }
    const rest = this.frames?.rest() ?? ''
    if (rest.trim()) this.deliver((handlers) => handlers.frame(rest))
    this.deliver((handlers) => handlers.end())
  }
}

/**
 * The agent loop's `chat` in channel mode: each request goes to the runner as an llm_request frame
 * and its llm_response comes back on stdin. When the runner goes away (EOF) or breaks the
 * protocol, every waiting request fails and `aborted` fires, so the run ends instead of hanging.
 */
export class RunnerChannel {
  private nextId = 1
  private readonly waiting = new Map<
    number,
    {resolve: (response: ChatResponse) => void; reject: (error: GatewayError) => void}
  >()
  private broken: GatewayError | undefined
  private readonly controller = new AbortController()
  /** Fires when the channel is gone: the run has nobody to answer it. */
  readonly aborted = this.controller.signal

  constructor(
    reader: StdinReader,
    private readonly write: (frame: AgentRunFrame) => void,
  ) {
    reader.attach({
      frame: (line) => this.receive(line),
      broken: (error) => this.close(new GatewayError('E_INPUT', `the runner sent ${error.message} on stdin`)),
      end: () =>
        this.close(
          new GatewayError(
            'E_RUN',
            'the runner closed stdin before the run finished (the gateway stopped or gave up on this run)',
          ),
        ),
    })
  }

  chat(request: ChatRequest): Promise<ChatResponse> {
    if (this.broken) return Promise.reject(this.broken)
    const id = this.nextId++
    const {system, messages, tools} = request
    return new Promise<ChatResponse>((resolve, reject) => {
      this.waiting.set(id, {resolve, reject})
      this.write({type: 'llm_request', id, request: {system, messages, tools}})
    })
  }

  private receive(line: string): void {
    try {
      const frame = parseLlmResponseFrame(line)
      const waiter = this.waiting.get(frame.id)
      if (!waiter) throw new FrameError(`an llm_response for request ${frame.id}, which is not waiting for an answer`)
      this.waiting.delete(frame.id)
      if (frame.ok) waiter.resolve(frame.response)
      else {
        const {code, message, retryable, suggestions, details} = frame.error
        waiter.reject(new GatewayError(code, message, {retryable, suggestions, details}))
      }
    } catch (error) {
      if (!(error instanceof FrameError)) throw error
      this.close(new GatewayError('E_INPUT', `the runner sent ${error.message} on stdin`))
    }
  }

  private close(error: GatewayError): void {
    if (this.broken) return
    this.broken = error
    for (const waiter of this.waiting.values()) waiter.reject(error)
    this.waiting.clear()
    this.controller.abort(error)
  }
}
