import {Flags} from '@oclif/core'
import {BaseCommand} from '../base-command.js'
import {buildContainerImages, type ContainerBuildResult} from '../../runtime/container/build.js'

export default class ContainerBuild extends BaseCommand<typeof ContainerBuild> {
  static summary =
    'build the container and isolation images of container-mode agents (a no-op when they are up to date)'
  static flags = {
    agent: Flags.string({char: 'a', description: 'only this agent (also when its container_mode is off)'}),
    force: Flags.boolean({description: 'rebuild even when the images are up to date'}),
  }
  static examples = [
    '<%= config.bin %> container build',
    '<%= config.bin %> container build --agent meepa --force',
    '<%= config.bin %> container build --json',
  ]

  async run(): Promise<ContainerBuildResult> {
    const interactive = Boolean(process.stdout.isTTY) && !process.env.CI && !this.jsonEnabled()
    const result = await buildContainerImages({
      loaded: this.loadConfig(),
      agentId: this.flags.agent,
      force: this.flags.force,
      display: this.jsonEnabled() ? 'silent' : interactive ? 'tasks' : 'lines',
      onLog: (line) => this.log(line),
    })
    if (result.note) this.log(result.note)
    for (const image of result.images) {
      this.log(
        `${image.agents.join(', ')}: ${image.isolation_image.tag} ${image.isolation_image.built ? `built (${image.isolation_image.reason})` : 'up to date'}`,
      )
    }
    return result
  }
}
