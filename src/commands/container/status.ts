import type {ChalkInstance} from 'chalk'
import {BaseCommand, engineFlag} from '../base-command.js'
import {containerStatus, type ContainerStatus} from '../../runtime/container/status.js'
import type {EngineFailure} from '../../runtime/container/per-engine.js'
import type {LoadedConfig} from '../../runtime/config/types.js'
import {engineAnswered, engineTargets} from '../../cli/engine-targets.js'
import {escapeControls as shown} from '../../runtime/util/escape-controls.js'

/** Thrown from the config loader when the config has an `engines:` list: each is then asked on its own. */
class HasEngines extends Error {}

type EngineStatus = ({name: string} & ContainerStatus) | EngineFailure

export default class ContainerStatusCommand extends BaseCommand<typeof ContainerStatusCommand> {
  static summary = "show the Docker engine, each container-mode agent's images and the gateway's running containers"
  static description =
    'Exits 0 when the engine answers (images may still need `container build`), 10 when it does not. With an `engines:` list, each engine is shown (or the one --engine names), and the exit is 10 when one does not answer.'
  static flags = {
    engine: engineFlag,
  }
  static examples = [
    '<%= config.bin %> container status',
    '<%= config.bin %> container status --json',
    '<%= config.bin %> container status --engine remote',
  ]

  async run(): Promise<ContainerStatus | {engines: EngineStatus[]}> {
    let loaded: LoadedConfig | undefined
    const load = () => (loaded ??= this.loadConfig())
    const colours = await this.colours()
    if (this.flags.engine === undefined) {
      try {
        const status = await containerStatus(() => {
          if (load().config.engines?.length) throw new HasEngines()
          return load()
        })
        this.print(status, colours, '')
        return status
      } catch (error) {
        if (!(error instanceof HasEngines)) throw error
      }
    }
    const targets = await engineTargets(load(), this.flags.engine)
    if (!targets) {
      const status = await containerStatus(load())
      this.print(status, colours, '')
      return status
    }
    const result = await (await import('../../runtime/container/per-engine.js')).statusOnEngines(load(), targets)
    for (const status of result.engines)
      if (engineAnswered((line) => this.log(line), status, '') && 'agents' in status)
        this.print(status, colours, `engine ${status.name}: `)
    return result
  }

  /** What the engine said (its version, containers, errors) is shown with its control characters escaped. */
  private print(status: ContainerStatus, {green, red, yellow}: ChalkInstance, prefix: string): void {
    const indent = prefix ? '  ' : ''
    // green: the engine is up (down is an error, exit 10)
    this.log(
      `${prefix ? `${prefix}\n${indent}` : ''}engine: ${green(`Docker ${shown(status.engine.server_version)} (API ${shown(status.engine.api_version)})`)}`,
    )
    for (const agent of status.agents) {
      if (agent.error) {
        this.log(`${indent}agent ${agent.agent}: ${red(shown(agent.error))}`)
        continue
      }
      const image = agent.isolation_image
      const state = !image.present
        ? red('missing, run `container build`')
        : image.up_to_date
          ? green('up to date')
          : yellow(`stale (${image.reason}), run \`container build\``)
      this.log(`${indent}agent ${agent.agent}: ${shown(image.tag)} ${state}`)
    }
    if (status.agents.length === 0)
      this.log(`${indent}no agent has container_mode.enabled${prefix ? ' and may run here' : ''}`)
    for (const {engine, warning} of status.engine_warnings)
      this.log(`${indent}engine ${engine}: ${yellow(shown(warning))}`)
    this.log(`${indent}containers: ${status.containers.length === 0 ? 'none running' : ''}`)
    for (const container of status.containers)
      this.log(
        `${indent}  ${shown(container.name)} ${container.state === 'running' ? green(container.state) : yellow(shown(container.state))} agent=${shown(container.agent ?? '-')} run=${shown(container.run ?? '-')}`,
      )
  }
}
