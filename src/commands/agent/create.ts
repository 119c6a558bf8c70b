import {Args} from '@oclif/core'
import {BaseCommand} from '../base-command.js'
import {ensureWorkspace, type WorkspaceCreation} from '../../runtime/workspace/workspace.js'
import {gatewayHome} from '../../runtime/util/paths.js'

export default class AgentCreate extends BaseCommand<typeof AgentCreate> {
  static summary = 'create an agent workspace (SOUL.md, MEMORY.md, memory.db, skills/); never overwrites existing files'
  static args = {id: Args.string({description: 'agent id: a-z, 0-9 and "-", up to 63 characters', required: true})}
  static examples = ['<%= config.bin %> agent create my-agent']

  async run(): Promise<WorkspaceCreation> {
    const result = ensureWorkspace(gatewayHome(), this.args.id)
    this.log(`workspace ${result.path}`)
    if (result.created.length > 0) this.log(`  created: ${result.created.join(', ')}`)
    if (result.kept.length > 0) this.log(`  kept (already there): ${result.kept.join(', ')}`)
    return result
  }
}
