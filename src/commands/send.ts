import {Args, Flags} from '@oclif/core'
import {BaseCommand} from './base-command.js'
import type {AgentRunOutput} from '../runtime/shapes/agent-run-contract.js'
import {GatewayError} from '../runtime/util/errors.js'
import {escapeControls} from '../runtime/util/escape-controls.js'
import {sendThroughGateway} from '../runtime/connectors/local-send/client.js'
import {FORWARDED_SIGNALS, readMessageArgument, signalExitCode} from '../runtime/send/input.js'

export default class Send extends BaseCommand<typeof Send> {
  static summary =
    "send one message to an agent and print its reply (runs the agent's whole loop in its isolation level)"
  static description =
    "With a gateway of the same MEEPAGATEWAY_HOME serving (meepagateway serve), the message runs there, in its queue, when that gateway has the same config and environment; otherwise send runs it itself. SIGINT (Ctrl-C) and SIGTERM are forwarded to the run, which is stopped with everything it started; send then exits with the run's status (130, 143)."
  static args = {message: Args.string({description: 'the message; "-" reads it from stdin', required: true})}
  static flags = {
    agent: Flags.string({char: 'a', description: 'agent id', required: true}),
    channel: Flags.string({description: 'conversation channel (history is kept per channel)', default: 'cli'}),
    unrestricted: Flags.boolean({description: 'run without any isolation, for this invocation only'}),
  }
  static examples = [
    '<%= config.bin %> send --agent meepa "what files are in your workspace?"',
    'echo "summarise notes.md" | <%= config.bin %> send --agent meepa -',
  ]

  async run(): Promise<AgentRunOutput> {
    const content = await readMessageArgument(this.args.message, () => process.stdin)
    const stop = new AbortController()
    const forward = (signal: NodeJS.Signals) => stop.abort(signal)
    for (const signal of FORWARDED_SIGNALS) process.on(signal, forward)
    try {
      const request = {
        agentId: this.flags.agent,
        channel: this.flags.channel,
        content,
        unrestricted: this.flags.unrestricted,
        // the run's log names what engines and agents said: their control characters are shown, not obeyed
        onLog: (line: string) => this.logToStderr(escapeControls(line)),
        signal: stop.signal,
      }
      const output =
        (await sendThroughGateway({...request, configPath: this.flags.config})) ??
        // no gateway took it: the whole run in this process (its code, config loading included, is loaded only then)
        (
          await (
            await import('../runtime/send/one-shot.js')
          ).sendOneShot({...request, configPath: this.flags.config, notice: (line) => this.logToStderr(line)})
        ).output
      if (!output.ok) {
        const {suggestions, ...details} = output.error.details ?? {}
        const signal = stop.signal.aborted ? String(stop.signal.reason) : undefined
        const exitCode =
          typeof details.exit_code === 'number' && details.exit_code > 128
            ? details.exit_code
            : signal
              ? signalExitCode(signal)
              : undefined
        throw new GatewayError(output.error.code, output.error.message, {
          retryable: output.error.retryable,
          suggestions: Array.isArray(suggestions) ? suggestions.map(String) : [],
          details: {...details, run_id: output.run_id},
          ...(signal ? {exitCode} : {}),
        })
      }
      this.log(output.reply.content)
      return output
    } finally {
      for (const signal of FORWARDED_SIGNALS) process.off(signal, forward)
    }
  }
}
