import {Command} from '@oclif/core'
import {CONFIG_SCHEMA} from '../../runtime/config/schema.js'

export default class ConfigSchema extends Command {
  static summary = 'print the JSON Schema of config.yaml (for editors and CI validation)'
  static examples = ['<%= config.bin %> config schema > config.schema.json']

  // like every command (README): with --json the schema is the result
  static enableJsonFlag = true

  async run(): Promise<typeof CONFIG_SCHEMA> {
    // parsing is what rejects stray flags and arguments (`config schema --bogus`)
    await this.parse(ConfigSchema)
    this.log(JSON.stringify(CONFIG_SCHEMA, null, 2))
    return CONFIG_SCHEMA
  }
}
