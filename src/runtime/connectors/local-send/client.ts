import fs from 'node:fs'
import type {Socket} from 'node:net'
import os from 'node:os'
import path from 'node:path'
import type {AgentRunOutput} from '../../shapes/agent-run-contract.js'
import {GatewayError} from '../../util/errors.js'
import {defaultConfigPath, gatewayHome} from '../../util/paths.js'
import {signalExitCode} from '../../send/input.js'
import {buildIdentity} from '../../util/build-identity.js'
import {
  LOCAL_SEND_VERSION,
  localSendDir,
  sameRunDigest,
  type LocalSendAnswer,
  type LocalSendHello,
  type LocalSendRequest,
  type LocalSendSignal,
} from './protocol.js'

/** The gateway answers `accepted` or `declined` at once; one that says nothing by then is stopped or hung. */
const ANSWER_DEADLINE_MS = 10_000
/**
 * After a forwarded Ctrl-C / SIGTERM a run ends within its grace (1 s) and the keeper's (2 s), a
 * container's within `docker kill`'s 2 s, the client's 3 s and its collection's 3 s: past this,
 * `send` stops waiting.
 */
const SIGNALLED_DEADLINE_MS = 15_000

export interface SendThroughGatewayOptions {
  agentId: string
  channel: string
  content: string
  unrestricted?: boolean
  /** --config, as given. */
  configPath?: string
  onLog?: (line: string) => void
  /** Aborted with 'SIGINT' / 'SIGTERM' when `send` receives it: forwarded to the run. */
  signal?: AbortSignal
  env?: NodeJS.ProcessEnv
}

/**
 * The run's output when a gateway of this home ran the message (docs/architecture.md); undefined
 * when none is serving, or it did not run the message (another build, config, environment or
 * process context, busy, stopping, not its token): `send` then runs it itself. Throws when the
 * gateway took the message and then stopped answering or went away: the message is never run twice.
 */
export async function sendThroughGateway(options: SendThroughGatewayOptions): Promise<AgentRunOutput | undefined> {
  const env = options.env ?? process.env
  const home = gatewayHome(env)
  const configPath = path.resolve(options.configPath ?? defaultConfigPath(home))
  const debug =
    env.DEBUG !== undefined || env.MEEPAGATEWAY_DEBUG !== undefined
      ? (line: string) => process.stderr.write(`send: ${line}\n`)
      : () => {}
  let gateway: OwnGateway
  try {
    gateway = ownGateway(home)
  } catch {
    return undefined // no gateway, or not one of ours
  }
  let configText: string
  try {
    configText = fs.readFileSync(configPath, 'utf8')
  } catch {
    fs.closeSync(gateway.dirFd)
    return undefined // no config yet: the one-shot run says what to do
  }
  try {
    return await talk(gateway, configText, configPath, options, env, debug)
  } finally {
    fs.closeSync(gateway.dirFd)
  }
}

async function talk(
  gateway: OwnGateway,
  configText: string,
  configPath: string,
  options: SendThroughGatewayOptions,
  env: NodeJS.ProcessEnv,
  debug: (line: string) => void,
): Promise<AgentRunOutput | undefined> {
  // node:net (and the stream modules under it) only once a gateway left its token: a one-shot send never loads it
  const socket: Socket = process.getBuiltinModule('node:net').connect(gateway.socketPath)
  socket.on('error', () => {})
  const connected = await new Promise<boolean>((resolve) => {
    socket.once('connect', () => resolve(true))
    socket.once('error', () => resolve(false))
  })
  if (!connected) return undefined // a gateway that crashed left its token
  const user = os.userInfo().username
  const hello: LocalSendHello = {type: 'hello', token: gateway.token}
  const request: LocalSendRequest = {
    type: 'send',
    version: LOCAL_SEND_VERSION,
    build: buildIdentity(),
    agent: options.agentId,
    channel: options.channel,
    content: options.content,
    user: {id: user, name: user},
    unrestricted: Boolean(options.unrestricted),
    config_path: configPath,
    digest: sameRunDigest(gateway.token, configText, env),
  }
  socket.write(`${JSON.stringify(hello)}\n${JSON.stringify(request)}\n`)
  let settle: (outcome: {output?: AgentRunOutput; error?: GatewayError}) => void
  const settled = new Promise<{output?: AgentRunOutput; error?: GatewayError}>((resolve) => (settle = resolve))
  let accepted = false
  const stopped = (what: string) => {
    const signal = options.signal?.aborted ? String(options.signal.reason) : undefined
    return new GatewayError(
      'E_RUN',
      `the gateway ${what}; its run is stopped as soon as it sees send gone, and may have done part of its work`,
      {
        suggestions: ['see the gateway log (meepagateway serve) for why', 'send the message again'],
        // interrupted by the operator: the status of an interrupted send (130, 143), as ever
        ...(signal ? {exitCode: signalExitCode(signal)} : {}),
      },
    )
  }
  let deadline = setTimeout(
    () => settle({error: stopped(`did not answer within ${ANSWER_DEADLINE_MS / 1000} s`)}),
    ANSWER_DEADLINE_MS,
  )
  const forward = () => {
    const frame: LocalSendSignal = {type: 'signal', signal: options.signal?.reason as LocalSendSignal['signal']}
    socket.write(`${JSON.stringify(frame)}\n`)
    // the run's own answer (cancelled, with its exit status) normally comes well before this
    clearTimeout(deadline)
    deadline = setTimeout(
      () =>
        settle({
          error: stopped(
            `did not end the run within ${SIGNALLED_DEADLINE_MS / 1000} s of ${String(options.signal?.reason)}`,
          ),
        }),
      SIGNALLED_DEADLINE_MS,
    )
  }
  options.signal?.addEventListener('abort', forward)
  // a Ctrl-C while connecting: the gateway stops the run as soon as it takes it
  if (options.signal?.aborted) forward()
  let pending = ''
  socket.setEncoding('utf8')
  socket.on('data', (chunk: string) => {
    pending += chunk
    for (let newline = pending.indexOf('\n'); newline !== -1; newline = pending.indexOf('\n')) {
      const line = pending.slice(0, newline)
      pending = pending.slice(newline + 1)
      let frame: LocalSendAnswer
      try {
        frame = JSON.parse(line) as LocalSendAnswer
      } catch {
        frame = {type: 'refused', message: 'an answer that is not JSON'}
      }
      if (frame.type === 'accepted') {
        accepted = true
        // a run takes as long as it takes; Ctrl-C is the way out
        if (!options.signal?.aborted) clearTimeout(deadline)
      } else if (frame.type === 'log') options.onLog?.(frame.line)
      else if (frame.type === 'result') settle({output: frame.output})
      else if (frame.type === 'declined' || !accepted) {
        // nothing ran: send runs the message itself
        debug(
          `the gateway did not run the message (${frame.type === 'declined' ? frame.reason : frame.type === 'refused' ? frame.message : 'no answer'}); running it here`,
        )
        settle({})
      }
    }
  })
  socket.once('close', () => settle(accepted ? {error: stopped('stopped before it sent the result')} : {}))
  try {
    const outcome = await settled
    if (outcome.error) throw outcome.error
    return outcome.output
  } finally {
    clearTimeout(deadline)
    options.signal?.removeEventListener('abort', forward)
    socket.destroy()
  }
}

interface OwnGateway {
  token: string
  /** The directory, held open: what is checked is what is connected to. */
  dirFd: number
  socketPath: string
}

/**
 * The gateway's token and socket, when its directory and files are this user's alone (as `serve`
 * makes them): a socket and token someone else could have put there would get the message. The
 * directory is opened once and both are reached through it (on Linux), so nothing can be swapped
 * in between the checks and the connection.
 */
function ownGateway(home: string): OwnGateway {
  const uid = process.getuid?.()
  const mine = (stats: fs.Stats) => (uid === undefined || stats.uid === uid) && (stats.mode & 0o077) === 0
  const dirFd = fs.openSync(
    localSendDir(home),
    fs.constants.O_RDONLY | fs.constants.O_DIRECTORY | fs.constants.O_NOFOLLOW,
  )
  try {
    const dir = process.platform === 'linux' ? `/proc/self/fd/${dirFd}` : localSendDir(home)
    if (!mine(fs.fstatSync(dirFd))) throw new Error("not this user's gateway")
    const tokenFd = fs.openSync(path.join(dir, 'send.token'), fs.constants.O_RDONLY | fs.constants.O_NOFOLLOW)
    try {
      const socketPath = path.join(dir, 'send.sock')
      if (!mine(fs.fstatSync(tokenFd)) || !mine(fs.lstatSync(socketPath))) throw new Error("not this user's gateway")
      return {token: fs.readFileSync(tokenFd, 'utf8'), dirFd, socketPath}
    } finally {
      fs.closeSync(tokenFd)
    }
  } catch (error) {
    fs.closeSync(dirFd)
    throw error
  }
}
