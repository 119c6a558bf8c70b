import {Flags} from '@oclif/core'
import {BaseCommand} from '../base-command.js'
import {sandboxExec} from '../../runtime/host-sandbox/exec.js'

export default class SandboxExec extends BaseCommand<typeof SandboxExec> {
  static summary = "run any command under an agent's host sandbox policy (exit status passed through)"
  static description =
    'The operator\'s debugging tool: the command gets exactly what the agent would get (files, network, environment). Put the command after "--": everything after it is passed through untouched.'
  static strict = false
  static enableJsonFlag = false
  static flags = {
    agent: Flags.string({char: 'a', description: 'agent id whose policy to apply', required: true}),
    timeout: Flags.integer({
      description: 'kill the command (and everything it started) after this many seconds',
      default: 3600,
      min: 1,
    }),
  }
  static examples = [
    '<%= config.bin %> sandbox exec --agent meepa -- ls -la',
    '<%= config.bin %> sandbox exec --agent meepa -- cat ~/.ssh/id_ed25519   # fails: Permission denied',
  ]

  async run(): Promise<{exit_code: number}> {
    const {exitCode, timedOut} = await sandboxExec({
      loaded: this.loadConfig(),
      agentId: this.flags.agent,
      argv: commandAfterSeparator(this.argv),
      timeoutMs: this.flags.timeout * 1000,
      onLog: (line) => this.logToStderr(line),
    })
    if (timedOut) this.logToStderr(`sandbox exec: the command ran longer than ${this.flags.timeout} s and was killed`)
    process.exitCode = exitCode
    return {exit_code: exitCode}
  }
}

/**
 * The command exactly as typed after the first `--`: oclif 4's parser reorders and dedupes the argv
 * of non-strict commands.
 */
export function commandAfterSeparator(raw: readonly string[]): string[] {
  const separator = raw.indexOf('--')
  return separator < 0 ? [] : raw.slice(separator + 1)
}
