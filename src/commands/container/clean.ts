import {Flags} from '@oclif/core'
import {BaseCommand, engineFlag} from '../base-command.js'
import {cleanContainers, type ContainerCleanResult} from '../../runtime/container/clean.js'
import type {EngineCleanResult, EngineFailure} from '../../runtime/container/per-engine.js'
import {engineAnswered, engineTargets} from '../../cli/engine-targets.js'
import {escapeControls as shown} from '../../runtime/util/escape-controls.js'

export default class ContainerClean extends BaseCommand<typeof ContainerClean> {
  static summary = 'remove containers left behind and images no config refers to'
  static description =
    "With an `engines:` list, on each engine (or the one --engine names) and only this gateway home's own objects: its containers left behind, its per-agent workspace volumes (the next run there copies the workspace whole), and the images it built or shipped there that nothing uses."
  static flags = {
    all: Flags.boolean({
      description: 'remove every meepagateway image not used by a container (they are rebuilt on first use)',
    }),
    'dry-run': Flags.boolean({description: 'only print what would be removed'}),
    engine: engineFlag,
  }
  static examples = [
    '<%= config.bin %> container clean --dry-run',
    '<%= config.bin %> container clean --all --json',
    '<%= config.bin %> container clean --engine remote',
  ]

  async run(): Promise<ContainerCleanResult | {engines: Array<({name: string} & EngineCleanResult) | EngineFailure>}> {
    const loaded = this.loadConfig()
    const options = {all: this.flags.all, dryRun: this.flags['dry-run']}
    const targets = await engineTargets(loaded, this.flags.engine)
    if (!targets) {
      const result = await cleanContainers(loaded, options)
      this.print(result, '')
      return result
    }
    const result = await (
      await import('../../runtime/container/per-engine.js')
    ).cleanOnEngines(loaded, targets, options)
    for (const cleaned of result.engines) {
      if (!engineAnswered((line) => this.log(line), cleaned) || !('volumes' in cleaned)) continue
      const verb = cleaned.dry_run ? 'would remove' : 'removed'
      for (const volume of cleaned.volumes)
        this.log(`  ${verb} volume ${shown(volume.name)} (agent ${shown(volume.agent)})`)
      for (const volume of cleaned.kept_volumes)
        this.log(`  kept volume ${shown(volume.name)}: ${shown(volume.reason)}`)
      this.print(cleaned, '  ')
    }
    return result
  }

  /** Names, states and refusals come from the engine: shown with their control characters escaped. */
  private print(result: ContainerCleanResult, indent: string): void {
    const verb = result.dry_run ? 'would remove' : 'removed'
    for (const container of result.containers)
      this.log(
        `${indent}${verb} container ${shown(container.name)} (${shown(container.state)}, agent ${shown(container.agent ?? '-')})`,
      )
    for (const container of result.kept_containers)
      this.log(`${indent}kept container ${shown(container.name)}: ${shown(container.reason)}`)
    for (const image of result.images) this.log(`${indent}${verb} image ${shown(image.ref)}`)
    for (const image of result.kept) this.log(`${indent}kept image ${shown(image.ref)}: ${shown(image.reason)}`)
    this.log(
      `${indent}${verb} ${result.containers.length} container(s) and ${result.images.length} image(s), ${Math.round(result.reclaimed_bytes / 1e6)} MB`,
    )
  }
}
