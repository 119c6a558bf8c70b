import {BaseCommand} from '../base-command.js'
import {connectorConfigWarnings} from '../../runtime/config/connector-warnings.js'
import {describeConfig, type ConfigReport} from '../../runtime/config/report.js'
import {sandboxConfigWarnings} from '../../runtime/host-sandbox/config-warnings.js'
import {insecureEngines} from '../../runtime/config/load.js'
import {podmanLimitWarnings} from '../../runtime/container/podman-limits.js'
import type {GatewayConfig} from '../../runtime/config/types.js'
import {toGatewayError} from '../../runtime/util/errors.js'

export default class ConfigCheck extends BaseCommand<typeof ConfigCheck> {
  static summary = 'validate config.yaml and print the resolved config with secrets masked'
  static examples = ['<%= config.bin %> config check', '<%= config.bin %> config check --config ./config.yaml --json']

  async run(): Promise<
    ConfigReport & {
      warnings: Array<{agent: string; warning: string}>
      engine_warnings: Array<{engine: string; warning: string}>
    }
  > {
    const loaded = this.loadConfig()
    const report = describeConfig(loaded)
    const warnings = [...connectorConfigWarnings(loaded.config), ...(await sandboxConfigWarnings(loaded))]
    this.log(`config ok: ${report.path}`)
    for (const {agent, warning} of warnings) this.logToStderr(`warning: agent ${agent}: ${warning}`)
    const engineWarnings = [
      ...insecureEngines(loaded.config).map((engine) => ({
        engine,
        warning: 'reached without TLS (insecure: true): anyone who reaches its port can run anything there',
      })),
      ...(await contextProblems(loaded.config)),
    ]
    if (loaded.config.engines?.some((engine) => engine.kind === 'podman'))
      engineWarnings.push(...(await podmanLimitWarnings(loaded.config.engines)))
    for (const {engine, warning} of engineWarnings) this.logToStderr(`warning: engine ${engine}: ${warning}`)
    this.log(report.yaml)
    return {...report, warnings, engine_warnings: engineWarnings}
  }
}

/** Each `context:` engine whose context cannot be used (read with the docker CLI, only when there is one). */
async function contextProblems(config: GatewayConfig): Promise<Array<{engine: string; warning: string}>> {
  const listed = (config.engines ?? []).filter((engine) => engine.context !== undefined)
  if (listed.length === 0) return []
  const {resolveContext} = await import('../../runtime/container/engine-context.js')
  return listed.flatMap((engine) => {
    try {
      resolveContext(engine)
      return []
    } catch (error) {
      const failed = toGatewayError(error)
      return [{engine: engine.name, warning: [failed.message, ...failed.suggestions].join('; ')}]
    }
  })
}
