import {Args} from '@oclif/core'
import {BaseCommand} from '../base-command.js'
import {readyWorkspace, type WorkspaceCreation} from '../../runtime/workspace/workspace.js'
import {loadConfig} from '../../runtime/config/load.js'
import {DEFAULT_AGENT} from '../../runtime/config/defaults.js'
import {gatewayHome} from '../../runtime/util/paths.js'

export default class AgentCreate extends BaseCommand<typeof AgentCreate> {
  static summary = 'create an agent workspace (SOUL.md, MEMORY.md, memory.db, skills/); never overwrites existing files'
  static args = {id: Args.string({description: 'agent id: a-z, 0-9 and "-", up to 63 characters', required: true})}
  static examples = ['<%= config.bin %> agent create my-agent']

  async run(): Promise<WorkspaceCreation> {
    const home = gatewayHome()
    const result = await readyWorkspace(home, this.args.id, diskLimitOf(home, this.args.id))
    this.log(`workspace ${result.path}`)
    if (result.created.length > 0) this.log(`  created: ${result.created.join(', ')}`)
    if (result.kept.length > 0) this.log(`  kept (already there): ${result.kept.join(', ')}`)
    return result
  }
}

/** The agent's limits.disk in the config, or the default for an agent not (yet) in it or without a config. */
function diskLimitOf(home: string, id: string): string {
  try {
    const agent = loadConfig({home}).config.agents.find((candidate) => candidate.id === id)
    if (agent) return agent.limits.disk
  } catch {
    // no config (yet), or one that does not load: the default, as the agent would get
  }
  return DEFAULT_AGENT.limits.disk
}
