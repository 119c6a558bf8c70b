import type {FakeLlm} from '../fakes/llm-server.js'
import type {TestHome} from './home.js'
import {loadConfig} from '../../src/runtime/config/load.js'
import {runMessage, type RunMessageResult} from '../../src/runtime/runners/run-message.js'

/**
 * One message on the path a running gateway takes (runMessage with `standby`): the fake LLM asks
 * for one shell command, then answers with what the command printed.
 */
export function runShellWithStandby(
  llm: FakeLlm,
  home: TestHome,
  agentId: string,
  command: string,
  onLog?: (line: string) => void,
): Promise<RunMessageResult> {
  llm.reset() // a run that timed out left its final turn queued
  llm.enqueue({toolCalls: [{name: 'shell', arguments: {command}}]}, (request) => ({
    text: String(request.body.messages.at(-1).content),
  }))
  return runMessage({
    loaded: loadConfig({configPath: home.configPath, home: home.home}),
    agentId,
    message: {id: 'm', connector: 'cli', channel_id: 'c', user: {id: 'u', name: 'u'}, content: 'probe'},
    standby: true,
    onLog,
  })
}
