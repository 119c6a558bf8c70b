import {BaseCommand} from '../base-command.js'
import {describeConfig, type ConfigReport} from '../../runtime/config/report.js'

export default class ConfigCheck extends BaseCommand<typeof ConfigCheck> {
  static summary = 'validate config.yaml and print the resolved config with secrets masked'
  static examples = ['<%= config.bin %> config check', '<%= config.bin %> config check --config ./config.yaml --json']

  async run(): Promise<ConfigReport> {
    const report = describeConfig(this.loadConfig())
    this.log(`config ok: ${report.path}`)
    this.log(report.yaml)
    return report
  }
}
