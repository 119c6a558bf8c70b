import {Command} from '@oclif/core'
import {main} from '../runtime/agent-run/main.js'

/**
 * Normally bin/run.js starts agent-run without oclif (start-up speed); this keeps it in help and
 * reachable via the dev bin.
 */
export default class AgentRun extends Command {
  static summary =
    'run one agent message: its input on stdin, its result on stdout (the program every isolation level runs)'
  static description =
    'The contract is docs/agent-run.md. Run by hand (no llm_channel in the input) it calls the LLM providers itself, with the keys in your environment; under a runner it asks the runner for each LLM call over stdin/stdout. Logs go to stderr. Exit 0 on success.'
  static examples = ['ANTHROPIC_API_KEY=... <%= config.bin %> agent-run < input.json']

  async run(): Promise<void> {
    await main()
  }
}
