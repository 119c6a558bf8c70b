import fs from 'node:fs'
import type {Socket} from 'node:net'
import os from 'node:os'
import path from 'node:path'
import type {AgentRunOutput} from '../../agent-run/contract.js'
import {GatewayError} from '../../util/errors.js'
import {defaultConfigPath, gatewayHome} from '../../util/paths.js'
import {buildIdentity, LOCAL_SEND_VERSION, localSendDir, localSendSocket, localSendToken, sameRunDigest, type LocalSendAnswer, type LocalSendHello, type LocalSendRequest} from './protocol.js'

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
 * when none is serving, or it did not take the message (another config or environment, busy, not
 * its token): `send` then runs it itself. Throws when the gateway took the message and went away
 * before its result: the message is never run twice.
 */
export async function sendThroughGateway(options: SendThroughGatewayOptions): Promise<AgentRunOutput | undefined> {
  const env = options.env ?? process.env
  const home = gatewayHome(env)
  const configPath = path.resolve(options.configPath ?? defaultConfigPath(home))
  let token: string
  let configText: string
  try {
    token = ownToken(home)
    configText = fs.readFileSync(configPath, 'utf8')
  } catch {
    return undefined // no gateway, or not one of ours (or no config yet: the one-shot run says what to do)
  }
  // node:net (and the stream modules under it) only once a gateway left its token: a one-shot send never loads it
  const socket: Socket = process.getBuiltinModule('node:net').connect(localSendSocket(home))
  socket.on('error', () => {})
  const connected = await new Promise<boolean>((resolve) => {
    socket.once('connect', () => resolve(true))
    socket.once('error', () => resolve(false))
  })
  if (!connected) return undefined // a gateway that crashed left its token
  const user = os.userInfo().username
  const hello: LocalSendHello = {type: 'hello', token}
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
    digest: sameRunDigest(configText, env),
  }
  socket.write(`${JSON.stringify(hello)}\n${JSON.stringify(request)}\n`)
  const forward = () => socket.write(`${JSON.stringify({type: 'signal', signal: options.signal?.reason})}\n`)
  options.signal?.addEventListener('abort', forward)
  // a Ctrl-C while connecting: the gateway stops the run as soon as it takes it
  if (options.signal?.aborted) forward()
  try {
    return await new Promise<AgentRunOutput | undefined>((resolve, reject) => {
      let pending = ''
      let accepted = false
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
            frame = {type: 'declined', reason: 'not an answer'}
          }
          if (frame.type === 'accepted') accepted = true
          else if (frame.type === 'log') options.onLog?.(frame.line)
          else if (frame.type === 'result') resolve(frame.output)
          // nothing ran: declined, refused (the token is another gateway's), or an answer that is not one before `accepted`
          else if (!accepted) resolve(undefined)
        }
      })
      socket.once('close', () => {
        if (!accepted) return resolve(undefined)
        reject(
          new GatewayError('E_RUN', 'the gateway stopped before it sent the result; its run was stopped with everything it started, and may have done part of its work', {
            suggestions: ['see the gateway log for why it stopped', 'send the message again'],
          }),
        )
      })
    })
  } finally {
    options.signal?.removeEventListener('abort', forward)
    socket.destroy()
  }
}

/**
 * The token, when the gateway's directory and files are this user's alone (as `serve` makes them):
 * a socket and token someone else could have put there would get the message and the digest.
 */
function ownToken(home: string): string {
  const uid = process.getuid?.()
  const mine = (stats: fs.Stats) => (uid === undefined || stats.uid === uid) && (stats.mode & 0o077) === 0
  const tokenFd = fs.openSync(localSendToken(home), fs.constants.O_RDONLY | fs.constants.O_NOFOLLOW)
  try {
    if (!mine(fs.lstatSync(localSendDir(home))) || !mine(fs.fstatSync(tokenFd)) || !mine(fs.lstatSync(localSendSocket(home)))) throw new Error('not this user\'s gateway')
    return fs.readFileSync(tokenFd, 'utf8')
  } finally {
    fs.closeSync(tokenFd)
  }
}
