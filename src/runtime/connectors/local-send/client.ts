import fs from 'node:fs'
import net from 'node:net'
import os from 'node:os'
import path from 'node:path'
import type {AgentRunOutput} from '../../agent-run/contract.js'
import {GatewayError} from '../../util/errors.js'
import {defaultConfigPath, gatewayHome} from '../../util/paths.js'
import {LOCAL_SEND_VERSION, localSendSocket, localSendToken, sameRunDigest, type LocalSendAnswer, type LocalSendRequest} from './protocol.js'

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
 * when none is serving, or it declined (another config or environment): `send` then runs it
 * itself. Throws when the gateway took the message and went away before its result.
 */
export async function sendThroughGateway(options: SendThroughGatewayOptions): Promise<AgentRunOutput | undefined> {
  const env = options.env ?? process.env
  const home = gatewayHome(env)
  let token: string
  let configText: string
  const configPath = path.resolve(options.configPath ?? defaultConfigPath(home))
  try {
    token = fs.readFileSync(localSendToken(home), 'utf8')
    configText = fs.readFileSync(configPath, 'utf8')
  } catch {
    return undefined // no gateway (or no config yet: the one-shot run says what to do)
  }
  const socket = net.connect(localSendSocket(home))
  socket.on('error', () => {})
  const connected = await new Promise<boolean>((resolve) => {
    socket.once('connect', () => resolve(true))
    socket.once('error', () => resolve(false))
  })
  if (!connected) return undefined // a gateway that crashed left its token
  const user = os.userInfo().username
  const request: LocalSendRequest = {
    type: 'send',
    version: LOCAL_SEND_VERSION,
    token,
    agent: options.agentId,
    channel: options.channel,
    content: options.content,
    user: {id: user, name: user},
    unrestricted: Boolean(options.unrestricted),
    config_path: configPath,
    digest: sameRunDigest(configText, env),
  }
  socket.write(`${JSON.stringify(request)}\n`);
  const forward = () => socket.write(`${JSON.stringify({type: 'signal', signal: options.signal?.reason})}\n`)
  options.signal?.addEventListener('abort', forward)
  try {
    return await new Promise<AgentRunOutput | undefined>((resolve, reject) => {
      let pending = ''
      let taken = false
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
            return reject(new GatewayError('E_INTERNAL', `the gateway answered something that is not JSON: ${line.slice(0, 80)}`))
          }
          if (frame.type === 'log') {
            taken = true
            options.onLog?.(frame.line)
          } else if (frame.type === 'result') resolve(frame.output)
          else if (frame.type === 'declined') resolve(undefined)
          else if (frame.type === 'refused') reject(new GatewayError('E_AUTH', `the gateway refused the message: ${frame.message}`, {suggestions: ['see the gateway log for why', 'restart the gateway (meepagateway serve) if its token file was replaced']}))
        }
      })
      socket.once('close', () =>
        reject(
          new GatewayError('E_RUN', `the gateway stopped before it sent the result${taken ? ' (the run had started)' : ''}; its run was stopped with everything it started, and may have done part of its work`, {
            suggestions: ['see the gateway log for why it stopped', 'send the message again'],
          }),
        ),
      )
    })
  } finally {
    options.signal?.removeEventListener('abort', forward)
    socket.destroy()
  }
}
