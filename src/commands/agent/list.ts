import {BaseCommand} from '../base-command.js'
import {listAgents, type AgentSummary} from '../../runtime/workspace/agents.js'

export default class AgentList extends BaseCommand<typeof AgentList> {
  static summary = 'list the configured agents with their isolation level and workspace'
  static examples = ['<%= config.bin %> agent list', '<%= config.bin %> agent list --json']

  async run(): Promise<AgentSummary[]> {
    const agents = listAgents(this.loadConfig())
    for (const agent of agents) {
      const workspace = agent.workspace_exists ? agent.workspace : `${agent.workspace} (not created yet)`
      this.log(
        `${agent.id.padEnd(20)} ${agent.isolation.padEnd(13)} ${agent.connectors.join(',') || '-'}  ${workspace}`,
      )
    }
    if (agents.length === 0) this.log('no agents configured')
    return agents
  }
}
