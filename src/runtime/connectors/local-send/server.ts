import crypto from 'node:crypto'
import fs from 'node:fs'
import net from 'node:net'
import type {InboundMessage} from '../../shapes/agent-run-contract.js'
import {LineSplitter} from '../../agent-run/channel.js'
import type {MessageDispatcher} from '../types.js'
import {randomHex} from '../../util/random.js'
import {buildIdentity} from '../../util/build-identity.js'
import {
  LOCAL_SEND_VERSION,
  localSendDir,
  localSendSocket,
  localSendToken,
  sameRunDigest,
  type LocalSendAnswer,
  type LocalSendHello,
  type LocalSendRequest,
} from './protocol.js'
import {makeDirectories} from '../../util/make-directories.js'

/** Before the token is checked a line may be this long: an unauthenticated client holds next to nothing. */
const MAX_HELLO_BYTES = 4096
/** The request: the message and a few fields (agent-run's own frames are capped the same). */
const MAX_REQUEST_BYTES = 8 * 1024 * 1024
/** A connection that has not sent its whole request by then is closed (a client that never writes holds nothing). */
const REQUEST_DEADLINE_MS = 10_000
/** Connections at once: past it a new one is told to run its message itself. */
const MAX_CONNECTIONS = 32
/** At most one log line per this long about refused requests (a local process can send many). */
const REFUSAL_LOG_EVERY_MS = 10_000

export interface LocalSendOptions {
  home: string
  /**
   * The config file the gateway runs with, and the text its config was parsed from (both can change
   * with a dashboard edit); no text, no message is taken.
   */
  config: () => {path: string; text?: string}
  /** `serve --unrestricted`: a request must say the same. */
  unrestricted: boolean
  agentIds: () => string[]
  dispatcher: MessageDispatcher
  /** The gateway's run queue: whether an agent's queue has room for one more message. */
  queue: {hasRoom(agentId: string): boolean}
  log: (line: string) => void
}

export interface LocalSendListener {
  /** No new requests; the runs of those taken go on and their results are sent. */
  close(): void
}

/**
 * The socket `send` hands its message to, so it runs in this gateway's queue with an agent-run
 * started ahead of it. Undefined (logged) when it cannot listen: `send` then runs messages itself.
 */
export async function listenForLocalSend(options: LocalSendOptions): Promise<LocalSendListener | undefined> {
  const socketPath = localSendSocket(options.home)
  const tokenPath = localSendToken(options.home)
  try {
    makeDirectories(localSendDir(options.home), 0o700)
    fs.chmodSync(localSendDir(options.home), 0o700)
    if (await answers(socketPath)) {
      options.log(`gateway: another gateway of this home answers on ${socketPath}; send goes to that one`)
      return undefined
    }
    fs.rmSync(socketPath, {force: true})
  } catch (error) {
    options.log(`gateway: send runs its messages itself (${(error as Error).message})`)
    return undefined
  }
  const token = randomHex(32)
  const context: ConnectionContext = {
    ...options,
    token,
    tokenBytes: Buffer.from(token),
    build: buildIdentity(),
    refused: refusalLog(options),
  }
  let connections = 0
  const server = net.createServer((socket) => {
    connections++
    socket.once('close', () => connections--)
    if (connections > MAX_CONNECTIONS)
      return void answerAndEnd(socket, {
        type: 'declined',
        reason: `the gateway is serving ${MAX_CONNECTIONS} connections already`,
      })
    serveConnection(socket, context)
  })
  const listening = await new Promise<boolean>((resolve) => {
    server.once('error', (error) => {
      options.log(`gateway: send runs its messages itself (cannot listen on ${socketPath}: ${error.message})`)
      resolve(false)
    })
    // the socket is born 0600: nobody else may connect between listen() and a chmod
    const umask = process.umask(0o177)
    try {
      server.listen(socketPath, () => resolve(true))
    } finally {
      process.umask(umask)
    }
  })
  if (!listening) return undefined
  // written after the socket: a client that finds the token finds a gateway answering
  fs.writeFileSync(`${tokenPath}.${process.pid}`, token, {mode: 0o600})
  fs.renameSync(`${tokenPath}.${process.pid}`, tokenPath)
  server.on('error', (error) => options.log(`gateway: the socket for send failed: ${error.message}`))
  return {
    close: () => {
      server.close()
      // only our own: a later gateway of this home may have its socket and token there by now
      if (readOr(tokenPath) === token) {
        fs.rmSync(tokenPath, {force: true})
        fs.rmSync(socketPath, {force: true})
      }
    },
  }
}

function readOr(file: string): string | undefined {
  try {
    return fs.readFileSync(file, 'utf8')
  } catch {
    return undefined
  }
}

/** Whether a process accepts connections on the socket (a socket file a crashed gateway left does not). */
function answers(socketPath: string): Promise<boolean> {
  if (!fs.existsSync(socketPath)) return Promise.resolve(false)
  return new Promise((resolve) => {
    const probe = net.connect(socketPath)
    probe.once('connect', () => (probe.destroy(), resolve(true)))
    probe.once('error', () => resolve(false))
  })
}

/** Logs the first refusal, then at most one line per REFUSAL_LOG_EVERY_MS with how many followed. */
function refusalLog(options: LocalSendOptions): (reason: string) => void {
  let last = 0
  let unlogged = 0
  return (reason) => {
    const now = Date.now()
    if (now - last < REFUSAL_LOG_EVERY_MS) return void unlogged++
    options.log(
      `gateway: refused a send over ${localSendSocket(options.home)}: ${reason}${unlogged > 0 ? ` (and ${unlogged} more since the last such line)` : ''}`,
    )
    last = now
    unlogged = 0
  }
}

/** The last answer, then the connection is gone (a client that keeps its side open holds no slot). */
function answerAndEnd(socket: net.Socket, frame: LocalSendAnswer): void {
  socket.on('error', () => {})
  socket.write(`${JSON.stringify(frame)}\n`)
  socket.destroySoon()
}

interface ConnectionContext extends LocalSendOptions {
  token: string
  tokenBytes: Buffer
  build: string
  refused: (reason: string) => void
}

/**
 * Two lines from the client: a hello with the token (small, checked first), then the request;
 * after that only signal lines. Answers: `declined` or `refused` (nothing ran), or `accepted`
 * followed by log lines and the `result`.
 */
function serveConnection(socket: net.Socket, context: ConnectionContext): void {
  socket.on('error', () => {})
  const answer = (frame: LocalSendAnswer) => {
    if (!socket.destroyed) socket.write(`${JSON.stringify(frame)}\n`)
  }
  const deadline = setTimeout(() => socket.destroy(), REQUEST_DEADLINE_MS)
  const run = new AbortController()
  let stage: 'hello' | 'request' | 'running' | 'done' = 'hello'
  const onLine = (line: string) => {
    if (stage === 'running') return void signalFrom(line, run)
    if (stage === 'done') return
    if (stage === 'hello') {
      const refusal = checkHello(line, context.tokenBytes)
      if (refusal) {
        stage = 'done'
        context.refused(refusal)
        clearTimeout(deadline)
        return void answerAndEnd(socket, {type: 'refused', message: refusal})
      }
      stage = 'request'
      lines = new LineSplitter(MAX_REQUEST_BYTES, onLine)
      return
    }
    clearTimeout(deadline)
    const request = parseRequest(line)
    if (typeof request === 'string') {
      stage = 'done'
      return void answerAndEnd(socket, {type: 'declined', reason: request})
    }
    stage = 'running'
    void handle(request, context, answer, run.signal).finally(() => {
      stage = 'done'
      socket.destroySoon()
    })
  }
  let lines = new LineSplitter(MAX_HELLO_BYTES, onLine)
  socket.on('data', (chunk: Buffer) => {
    try {
      // the rest of a chunk after the hello goes to the request's splitter
      let rest = chunk
      while (rest.length > 0) {
        const splitter = lines
        const newline = rest.indexOf(10)
        const part = newline === -1 ? rest : rest.subarray(0, newline + 1)
        splitter.push(part)
        rest = rest.subarray(part.length)
      }
    } catch {
      // a line past its limit: nothing was taken yet (or it is a signal line), so the client runs it itself
      if (stage === 'hello' || stage === 'request') stage = 'done'
      socket.destroy()
    }
  })
  // `send` gone (killed, its terminal closed): its run is stopped with everything it started
  socket.on('close', () => {
    clearTimeout(deadline)
    if (!run.signal.aborted) run.abort('abort')
  })
}

function signalFrom(line: string, run: AbortController): void {
  try {
    const frame = JSON.parse(line) as {type?: unknown; signal?: unknown}
    if (frame.type === 'signal' && (frame.signal === 'SIGINT' || frame.signal === 'SIGTERM') && !run.signal.aborted)
      run.abort(frame.signal)
  } catch {
    // not a signal: ignored, the run goes on
  }
}

/** Why the hello is refused: the token is the only thing looked at before it matches. */
function checkHello(line: string, expected: Buffer): string | undefined {
  let value: Partial<LocalSendHello>
  try {
    value = JSON.parse(line) as Partial<LocalSendHello>
  } catch {
    return 'the request is not JSON'
  }
  const token = Buffer.from(typeof value?.token === 'string' ? value.token : '')
  if (token.length !== expected.length || !crypto.timingSafeEqual(token, expected))
    return "the request does not carry this gateway's token"
  return undefined
}

/** The request, or why it cannot be taken as one. */
function parseRequest(line: string): LocalSendRequest | string {
  let value: Partial<LocalSendRequest>
  try {
    value = JSON.parse(line) as Partial<LocalSendRequest>
  } catch {
    return 'the request is not JSON'
  }
  const strings = ['agent', 'channel', 'content', 'config_path', 'digest', 'build'] as const
  if (
    value?.type !== 'send' ||
    strings.some((field) => typeof value[field] !== 'string') ||
    typeof value.unrestricted !== 'boolean'
  )
    return 'the request is malformed'
  if (typeof value.user?.id !== 'string' || typeof value.user.name !== 'string') return 'the request is malformed'
  return value as LocalSendRequest
}

async function handle(
  request: LocalSendRequest,
  context: ConnectionContext,
  answer: (frame: LocalSendAnswer) => void,
  signal: AbortSignal,
): Promise<void> {
  const declined = declineReason(request, context)
  if (declined) return answer({type: 'declined', reason: declined})
  const message: InboundMessage = {
    id: `cli_${randomHex(6)}`,
    connector: 'cli',
    channel_id: request.channel,
    user: request.user,
    content: request.content,
  }
  const quiet = {send: async () => {}, startTyping: () => () => {}}
  const ticket = context.dispatcher.dispatch(request.agent, message, quiet, {
    signal,
    onLog: (line) => answer({type: 'log', line}),
    // checked again when its turn comes: a dashboard edit while it waited makes it another run
    notRunBecause: () => notTheSameRun(request, context),
  })
  if (ticket.accepted) answer({type: 'accepted', run_id: ticket.runId})
  const outcome = await ticket.done
  // nothing ran (not taken, the gateway stopped while it waited, or it would now be another run): `send` runs it
  if (!outcome.output)
    return answer({
      type: 'declined',
      reason: `the gateway did not run it (${outcome.notRunBecause ?? outcome.rejectedBecause ?? outcome.status})`,
    })
  answer({type: 'result', output: outcome.output})
}

function declineReason(request: LocalSendRequest, context: ConnectionContext): string | undefined {
  const otherRun = notTheSameRun(request, context)
  if (otherRun) return otherRun
  if (!context.dispatcher.accepting) return 'the gateway is stopping'
  if (!context.queue.hasRoom(request.agent)) return "the agent's queue is full"
  return undefined
}

/** Why the gateway's run of the request would not be the run `send` would make itself. */
function notTheSameRun(request: LocalSendRequest, context: ConnectionContext): string | undefined {
  const config = context.config()
  if (request.version !== LOCAL_SEND_VERSION)
    return `this gateway speaks version ${LOCAL_SEND_VERSION} of the send socket`
  if (request.build !== context.build)
    return 'the gateway runs another build of meepagateway (restart it after an upgrade)'
  if (request.unrestricted !== context.unrestricted)
    return context.unrestricted
      ? 'the gateway runs every agent unrestricted'
      : '--unrestricted is for this invocation only'
  if (request.config_path !== config.path) return `the gateway runs with ${config.path}`
  if (config.text === undefined || request.digest !== sameRunDigest(context.token, config.text, process.env))
    return "the config file, the environment or the process context differs from the gateway's"
  if (!context.agentIds().includes(request.agent)) return 'no such agent in the gateway'
  return undefined
}
