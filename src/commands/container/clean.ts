import {Flags} from '@oclif/core'
import {BaseCommand} from '../base-command.js'
import {cleanContainers, type ContainerCleanResult} from '../../runtime/container/clean.js'

export default class ContainerClean extends BaseCommand<typeof ContainerClean> {
  static summary = 'remove containers left behind and images no config refers to'
  static flags = {
    all: Flags.boolean({
      description: 'remove every meepagateway image not used by a container (they are rebuilt on first use)',
    }),
    'dry-run': Flags.boolean({description: 'only print what would be removed'}),
  }
  static examples = ['<%= config.bin %> container clean --dry-run', '<%= config.bin %> container clean --all --json']

  async run(): Promise<ContainerCleanResult> {
    const result = await cleanContainers(this.loadConfig(), {all: this.flags.all, dryRun: this.flags['dry-run']})
    const verb = result.dry_run ? 'would remove' : 'removed'
    for (const container of result.containers)
      this.log(`${verb} container ${container.name} (${container.state}, agent ${container.agent ?? '-'})`)
    for (const container of result.kept_containers) this.log(`kept container ${container.name}: ${container.reason}`)
    for (const image of result.images) this.log(`${verb} image ${image.ref}`)
    for (const image of result.kept) this.log(`kept image ${image.ref}: ${image.reason}`)
    this.log(
      `${verb} ${result.containers.length} container(s) and ${result.images.length} image(s), ${Math.round(result.reclaimed_bytes / 1e6)} MB`,
    )
    return result
  }
}
