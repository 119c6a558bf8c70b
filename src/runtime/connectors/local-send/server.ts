import crypto from 'node:crypto'
import fs from 'node:fs'
import net from 'node:net'
import type {InboundMessage} from '../../agent-run/contract.js'
import {LineSplitter} from '../../agent-run/channel.js'
import type {Dispatcher} from '../../gateway/dispatcher.js'
import type {RunQueue} from '../../gateway/run-queue.js'
import {randomHex} from '../../util/random.js'
import {LOCAL_SEND_VERSION, localSendDir, localSendSocket, localSendToken, sameRunDigest, type LocalSendAnswer, type LocalSendRequest} from './protocol.js'

/** A request is one line: the message and a few fields (agent-run's own frames are capped the same). */
const MAX_REQUEST_BYTES = 8 * 1024 * 1024
/** A connection that has not sent its whole request by then is closed (a client that never writes holds nothing). */
const REQUEST_DEADLINE_MS = 10_000
/** Connections at once: past it a new one is closed at once (`send` then runs the message itself). */
const MAX_CONNECTIONS = 32

export interface LocalSendOptions {
  home: string
  /** The config file the gateway runs with, and its text as it was loaded (both can change with a dashboard edit). */
  config: () => {path: string; text: string}
  /** `serve --unrestricted`: a request must say the same. */
  unrestricted: boolean
  agentIds: () => string[]
  dispatcher: Dispatcher
  queue: RunQueue
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
    fs.mkdirSync(localSendDir(options.home), {recursive: true, mode: 0o700})
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
  const expected = Buffer.from(token)
  const server = net.createServer({pauseOnConnect: false}, (socket) => serveConnection(socket, options, expected))
  server.maxConnections = MAX_CONNECTIONS
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

function serveConnection(socket: net.Socket, options: LocalSendOptions, expected: Buffer): void {
  socket.on('error', () => {})
  const answer = (frame: LocalSendAnswer) => {
    if (!socket.destroyed) socket.write(`${JSON.stringify(frame)}\n`)
  }
  const deadline = setTimeout(() => socket.destroy(), REQUEST_DEADLINE_MS)
  let request: LocalSendRequest | undefined
  let refused = false
  const run = new AbortController()
  const lines = new LineSplitter(MAX_REQUEST_BYTES, (line) => {
    if (refused) return
    if (request) return void signalFrom(line, run)
    clearTimeout(deadline)
    const parsed = parseRequest(line, expected)
    if (typeof parsed === 'string') {
      refused = true
      options.log(`gateway: refused a send over ${localSendSocket(options.home)}: ${parsed}`)
      answer({type: 'refused', message: parsed})
      return void socket.destroySoon()
    }
    request = parsed
    void handle(parsed, options, answer, run.signal).finally(() => socket.end())
  })
  socket.on('data', (chunk: Buffer) => {
    try {
      lines.push(chunk)
    } catch {
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
    if (frame.type === 'signal' && (frame.signal === 'SIGINT' || frame.signal === 'SIGTERM') && !run.signal.aborted) run.abort(frame.signal)
  } catch {
    // not a signal: ignored, the run goes on
  }
}

/** The request, or why it is refused (the token first: nothing else is looked at without it). */
function parseRequest(line: string, expected: Buffer): LocalSendRequest | string {
  let value: Partial<LocalSendRequest>
  try {
    value = JSON.parse(line) as Partial<LocalSendRequest>
  } catch {
    return 'the request is not JSON'
  }
  const token = Buffer.from(typeof value?.token === 'string' ? value.token : '')
  if (token.length !== expected.length || !crypto.timingSafeEqual(token, expected)) return "the request does not carry this gateway's token"
  const strings = ['agent', 'channel', 'content', 'config_path', 'digest'] as const
  if (value.type !== 'send' || strings.some((field) => typeof value[field] !== 'string') || typeof value.unrestricted !== 'boolean') return 'the request is malformed'
  if (typeof value.user?.id !== 'string' || typeof value.user.name !== 'string') return 'the request is malformed'
  return value as LocalSendRequest
}

async function handle(request: LocalSendRequest, options: LocalSendOptions, answer: (frame: LocalSendAnswer) => void, signal: AbortSignal): Promise<void> {
  const config = options.config()
  const declined = await declineReason(request, options, config)
  if (declined) return answer({type: 'declined', reason: declined})
  const message: InboundMessage = {id: `cli_${randomHex(6)}`, connector: 'cli', channel_id: request.channel, user: request.user, content: request.content}
  const quiet = {send: async () => {}, startTyping: () => () => {}}
  const ticket = options.dispatcher.dispatch(request.agent, message, quiet, {signal, onLog: (line) => answer({type: 'log', line})})
  const outcome = await ticket.done
  if (!outcome.output) return answer({type: 'declined', reason: `the gateway did not run it (${outcome.rejectedBecause ?? outcome.status})`})
  answer({type: 'result', output: outcome.output});
}

async function declineReason(request: LocalSendRequest, options: LocalSendOptions, config: {path: string; text: string}): Promise<string | undefined> {
  if (request.version !== LOCAL_SEND_VERSION) return `this gateway speaks version ${LOCAL_SEND_VERSION} of the send socket`
  if (request.unrestricted !== options.unrestricted) return options.unrestricted ? 'the gateway runs every agent unrestricted' : '--unrestricted is for this invocation only'
  if (request.config_path !== config.path) return `the gateway runs with ${config.path}`
  if (request.digest !== sameRunDigest(config.text, process.env)) return "the config file or the environment differs from the gateway's"
  if (!options.agentIds().includes(request.agent)) return 'no such agent in the gateway'
  if (!options.dispatcher.accepting) return 'the gateway is stopping'
  if (!options.queue.hasRoom(request.agent)) return "the agent's queue is full"
  return undefined
}
