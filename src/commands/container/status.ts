import {BaseCommand} from '../base-command.js'
import {containerStatus, type ContainerStatus} from '../../runtime/container/status.js'

export default class ContainerStatusCommand extends BaseCommand<typeof ContainerStatusCommand> {
  static summary = "show the Docker engine, each container-mode agent's images and the gateway's running containers"
  static description = 'Exits 0 when the engine answers (images may still need `container build`), 10 when it does not.'
  static examples = ['<%= config.bin %> container status', '<%= config.bin %> container status --json']

  async run(): Promise<ContainerStatus> {
    const status = await containerStatus(() => this.loadConfig())
    const {green, red, yellow} = await this.colours()
    // green: the engine is up (down is an error, exit 10)
    this.log(`engine: ${green(`Docker ${status.engine.server_version} (API ${status.engine.api_version})`)}`)
    for (const agent of status.agents) {
      if (agent.error) {
        this.log(`agent ${agent.agent}: ${red(agent.error)}`)
        continue
      }
      const image = agent.isolation_image
      const state = !image.present
        ? red('missing, run `container build`')
        : image.up_to_date
          ? green('up to date')
          : yellow(`stale (${image.reason}), run \`container build\``)
      this.log(`agent ${agent.agent}: ${image.tag} ${state}`)
    }
    if (status.agents.length === 0) this.log('no agent has container_mode.enabled')
    for (const {engine, warning} of status.engine_warnings) this.log(`engine ${engine}: ${yellow(warning)}`)
    this.log(`containers: ${status.containers.length === 0 ? 'none running' : ''}`)
    for (const container of status.containers)
      this.log(
        `  ${container.name} ${container.state === 'running' ? green(container.state) : yellow(container.state)} agent=${container.agent ?? '-'} run=${container.run ?? '-'}`,
      )
    return status
  }
}
