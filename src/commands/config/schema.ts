import {Command} from '@oclif/core'
import {CONFIG_SCHEMA} from '../../runtime/config/schema.js'

export default class ConfigSchema extends Command {
  static summary = 'print the JSON Schema of config.yaml (for editors and CI validation)'
  static examples = ['<%= config.bin %> config schema > config.schema.json']

  async run(): Promise<void> {
    // no flags or arguments, but parsing is what rejects stray ones (`config schema --bogus`)
    await this.parse(ConfigSchema)
    this.log(JSON.stringify(CONFIG_SCHEMA, null, 2))
  }
}
