import {Args} from '@oclif/core'
import {BaseCommand} from '../base-command.js'
import {gatewayHome} from '../../runtime/paths.js'
import {createApiKey, type CreatedApiKey} from '../../runtime/state/api-keys.js'

export default class ApiKeyCreate extends BaseCommand<typeof ApiKeyCreate> {
  static summary = 'create an API key for the web chat API and the dashboard; the key is printed once and only its hash is stored'
  static args = {name: Args.string({description: 'a name to recognise the key by', required: true})}
  static examples = ['<%= config.bin %> api-key create "deploy script"', '<%= config.bin %> api-key create ci --json']

  async run(): Promise<CreatedApiKey> {
    const created = createApiKey({home: gatewayHome(), name: this.args.name})
    this.log(`Created API key ${created.id} (${created.name}):`)
    this.log('')
    this.log(`  ${created.key}`)
    this.log('')
    this.log('Copy it now: it is not stored and cannot be shown again.')
    this.log('Use it as: Authorization: Bearer <key>')
    return created
  }
}
