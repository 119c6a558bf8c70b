import {Command} from '@oclif/core'
import {main} from '../runtime/agent-run/main.js'

/** Normally bin/run.js starts agent-run without oclif (start-up speed); this keeps it in help and reachable via the dev bin. */
export default class AgentRun extends Command {
  static summary = 'run one agent message: one JSON object on stdin, one on stdout (the program every isolation level runs)'
  static description = 'Input and output follow docs/agent-run.md. Logs go to stderr. Exit 0 on success.'
  static examples = ['<%= config.bin %> agent-run < input.json']

  async run(): Promise<void> {
    await main()
  }
}
