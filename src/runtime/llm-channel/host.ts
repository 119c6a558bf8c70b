import type {Readable, Writable} from 'node:stream'
import {
  FrameError,
  LineSplitter,
  LLM_CHANNEL_VERSION,
  MAX_FRAME_BYTES,
  parseAgentRunFrame,
  type LlmResponseFrame,
} from '../agent-run/channel.js'
import type {AgentRunInput, AgentRunOutput} from '../shapes/agent-run-contract.js'
import {failure} from '../agent-run/output.js'
import type {AgentConfig, GatewayConfig} from '../config/types.js'
import {toGatewayError} from '../util/errors.js'
import {redactSecrets} from '../util/redact.js'
import {createProviderChain} from '../providers/index.js'
import type {ChatRequest, ChatResponse} from '../shapes/provider-types.js'

/** The runner's side of the LLM: the only place provider keys live and providers are called. */
export interface HostLlm {
  chat(request: ChatRequest): Promise<ChatResponse>
  /** Most LLM calls one run may ask for: the agent loop makes one per iteration. */
  maxCalls: number
  /** The keys in play: masked in every answer before it enters the sandbox (a provider or proxy may echo them). */
  secrets?: string[]
  /** Loads the provider's SDK and what its first request needs; called once agent-run is starting. */
  warm?(): void
}

/** Provider keys an agent's chain uses: its provider (or the primary) and the fallbacks, nothing else. */
export function providerKeysFor(
  agent: AgentConfig,
  config: GatewayConfig,
  available: Record<string, string>,
): Record<string, string> {
  const names = [agent.provider || config.providers.primary, ...config.providers.fallback].flatMap((name) => {
    const env = config.providers.providers[name]?.api_key_env
    return env && available[env] !== undefined ? [[env, available[env]] as const] : []
  })
  return Object.fromEntries(names)
}

/**
 * The agent's provider chain with its keys (providerKeysFor), host-side. Unknown provider names
 * throw E_CONFIG here. With redact_secrets, a key that turns up in the conversation (a tool printed
 * it) is masked before it reaches a provider.
 */
export function hostLlmFor(agent: AgentConfig, config: GatewayConfig, keys: Record<string, string>): HostLlm {
  const chain = createProviderChain(config.providers, keys, {provider: agent.provider, model: agent.model})
  const values = Object.values(keys)
  const scrub =
    config.image_config?.redact_secrets === false || values.length === 0
      ? (request: ChatRequest) => request
      : (request: ChatRequest) => redactRequest(request, values)
  return {
    chat: (request) => chain.chat(scrub(request)),
    maxCalls: agent.max_iterations,
    secrets: values,
    warm: () => chain.warm(),
  }
}

function redactRequest(request: ChatRequest, secrets: string[]): ChatRequest {
  const {signal, ...rest} = request
  const text = JSON.stringify(rest)
  const redacted = redactSecrets(text, secrets)
  return redacted === text ? request : {...(JSON.parse(redacted) as Omit<ChatRequest, 'signal'>), signal}
}

/**
 * Serves one agent-run's LLM channel (docs/agent-run.md) over its stdin/stdout: writes the input,
 * answers each llm_request through `llm`, keeps the result frame. agent-run is treated as hostile:
 * only well-formed requests reach a provider, one at a time, at most `llm.maxCalls` per run, each
 * frame at most MAX_FRAME_BYTES. Anything else is a violation: `onViolation` runs (the runner kills
 * the run) and `outcome()` reports E_RUN.
 */
export class AgentRunChannel {
  private readonly controller = new AbortController()
  private readonly lines: LineSplitter
  private calls = 0
  private lastId = 0
  private inFlight = false
  private result: AgentRunOutput | undefined
  /** Tokens the providers reported for this run's calls: what is recorded, whatever agent-run claims. */
  private readonly spent = {input_tokens: 0, output_tokens: 0}
  private violation: string | undefined
  /** Resolves once agent-run's stdout is at its end: its last line may arrive after the process has exited. */
  private readonly drained: Promise<void>

  constructor(
    private readonly stdin: Writable,
    stdout: Readable,
    private readonly input: AgentRunInput,
    private readonly llm: HostLlm,
    private readonly onViolation: () => void,
    /** The result arrived: agent-run has nothing left to say and should exit now. */
    private readonly onResult: () => void = () => {},
    /** The input is written once this resolves true (the keeper moved the run into its cgroups); never on false. */
    inputAllowed: Promise<boolean> = Promise.resolve(true),
    /** stdin stays open after the result: a sync engine's run ends when the runner has taken its changes (SYNC_TAKEN). */
    private readonly holdStdinAfterResult = false,
    /** What goes on stdin before the input, in the same write (a sync engine's go line). */
    lead = '',
  ) {
    this.lines = new LineSplitter(MAX_FRAME_BYTES, (line) => this.receive(line))
    stdin.on('error', () => {}) // agent-run gone: its exit is reported by the runner
    this.drained = new Promise((resolve) => {
      stdout.once('end', resolve)
      stdout.once('close', resolve)
      stdout.once('error', resolve)
    })
    stdout.on('data', (chunk: Buffer) => {
      if (this.violation) return
      try {
        this.lines.push(chunk)
      } catch (error) {
        this.violate(error)
      }
    })
    const line = `${lead}${JSON.stringify({...input, llm_channel: LLM_CHANNEL_VERSION})}\n`
    // the provider's client is loaded (≈ 15 ms of this thread) once the input is on its way, not before it
    void inputAllowed.then((allowed) => {
      if (!allowed || this.controller.signal.aborted) return
      stdin.write(line)
      llm.warm?.()
    })
  }

  /** The run is over (agent-run exited, or was killed): an LLM call still in flight is abandoned. */
  close(): void {
    this.controller.abort()
    this.stdin.end()
  }

  /** Waits (at most `ms`) until everything agent-run wrote has been read: call after it exited, before outcome(). */
  async settled(ms = 2_000): Promise<void> {
    if (this.result || this.violation) return
    let timer: NodeJS.Timeout | undefined
    await Promise.race([this.drained, new Promise((resolve) => (timer = setTimeout(resolve, ms)))])
    clearTimeout(timer)
  }

  /** Whether agent-run sent anything (a request or its result): it was running. */
  get spoke(): boolean {
    return this.lastId > 0 || this.result !== undefined || this.violation !== undefined
  }

  /** The result agent-run sent, or the failure it earned; undefined when it sent neither. */
  outcome(): AgentRunOutput | undefined {
    if (this.violation) {
      return failure(
        this.input.run_id,
        'E_RUN',
        `agent-run broke the LLM channel protocol: it sent ${this.violation}; the run was stopped`,
        false,
        {
          suggestions: [
            'this is a bug in agent-run or something inside the sandbox took it over; see docs/agent-run.md for the protocol',
          ],
        },
      )
    }
    if (!this.result) return undefined
    return {...this.result, run_id: this.input.run_id, ...(this.result.ok ? {usage: {...this.spent}} : {})}
  }

  private receive(line: string): void {
    if (this.violation) return
    try {
      const frame = parseAgentRunFrame(line)
      if (this.result) throw new FrameError(`a ${frame.type} frame after its result`)
      if (frame.type === 'result') {
        this.result = frame.output
        if (!this.holdStdinAfterResult) this.stdin.end()
        this.onResult()
        return
      }
      if (this.inFlight) throw new FrameError('a second llm_request while one was still unanswered')
      if (frame.id <= this.lastId) throw new FrameError(`an llm_request id ${frame.id} that was already used`)
      if (++this.calls > this.llm.maxCalls)
        throw new FrameError(`more llm_requests than the agent's max_iterations (${this.llm.maxCalls})`)
      this.lastId = frame.id
      this.inFlight = true
      void this.answer(frame.id, frame.request)
    } catch (error) {
      this.violate(error)
    }
  }

  private async answer(id: number, request: Omit<ChatRequest, 'signal'>): Promise<void> {
    let frame: LlmResponseFrame
    try {
      const response = await this.llm.chat({...request, signal: this.controller.signal})
      this.spent.input_tokens += response.usage.input_tokens
      this.spent.output_tokens += response.usage.output_tokens
      frame = {type: 'llm_response', id, ok: true, response}
    } catch (error) {
      const {code, message, retryable, suggestions, details} = toGatewayError(error, 'E_PROVIDER')
      frame = {type: 'llm_response', id, ok: false, error: {code, message, retryable, suggestions, details}}
    }
    this.inFlight = false
    if (this.controller.signal.aborted || this.violation) return
    // whatever redact_secrets says: a key echoed in an answer or an error must not reach agent-run
    this.stdin.write(`${redactSecrets(JSON.stringify(frame), this.llm.secrets ?? [])}\n`)
  }

  private violate(error: unknown): void {
    if (!(error instanceof FrameError)) throw error
    if (this.violation) return
    this.violation = error.message
    this.controller.abort()
    this.onViolation()
  }
}
