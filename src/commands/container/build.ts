import {Flags} from '@oclif/core'
import {BaseCommand, engineFlag} from '../base-command.js'
import {buildContainerImages, type ContainerBuildResult} from '../../runtime/container/build.js'
import type {EngineBuildResult, EngineFailure} from '../../runtime/container/per-engine.js'
import {engineAnswered, engineTargets} from '../../cli/engine-targets.js'

export default class ContainerBuild extends BaseCommand<typeof ContainerBuild> {
  static summary =
    'build the container and isolation images of container-mode agents (a no-op when they are up to date)'
  static description =
    "With an `engines:` list, on each engine that will run them (the agents' container_mode.engines), or the one --engine names: built there, or with --ship built here and copied over the same connection (docker save | docker load, no registry)."
  static flags = {
    agent: Flags.string({char: 'a', description: 'only this agent (also when its container_mode is off)'}),
    force: Flags.boolean({description: 'rebuild even when the images are up to date'}),
    engine: engineFlag,
    ship: Flags.boolean({
      description: 'build on this machine and copy the images to each engine instead of building there',
    }),
  }
  static examples = [
    '<%= config.bin %> container build',
    '<%= config.bin %> container build --agent meepa --force',
    '<%= config.bin %> container build --json',
    '<%= config.bin %> container build --engine remote --ship',
  ]

  async run(): Promise<ContainerBuildResult | {engines: Array<({name: string} & EngineBuildResult) | EngineFailure>}> {
    const interactive = Boolean(process.stdout.isTTY) && !process.env.CI && !this.jsonEnabled()
    const loaded = this.loadConfig()
    const options = {
      loaded,
      agentId: this.flags.agent,
      force: this.flags.force,
      display: this.jsonEnabled() ? 'silent' : interactive ? 'tasks' : 'lines',
      onLog: (line: string) => this.log(line),
    } as const
    const targets = await engineTargets(loaded, this.flags.engine)
    if (!targets) {
      const result = await buildContainerImages(options)
      this.print(result, '')
      return result
    }
    const result = await (
      await import('../../runtime/container/per-engine.js')
    ).buildOnEngines({
      ...options,
      // several engines: plain lines say which one each step is for
      display: options.display === 'silent' ? 'silent' : 'lines',
      onLog: this.jsonEnabled() ? undefined : options.onLog,
      targets,
      ship: this.flags.ship,
    })
    for (const built of result.engines) {
      if (!engineAnswered((line) => this.log(line), built) || !('shipped' in built)) continue
      for (const tag of built.shipped) this.log(`  shipped ${tag}`)
      this.print(built, '  ')
    }
    return result
  }

  private print(result: ContainerBuildResult, indent: string): void {
    if (result.note) this.log(`${indent}${result.note}`)
    for (const image of result.images) {
      this.log(
        `${indent}${image.agents.join(', ')}: ${image.isolation_image.tag} ${image.isolation_image.built ? `built (${image.isolation_image.reason})` : 'up to date'}`,
      )
    }
  }
}
