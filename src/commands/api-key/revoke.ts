import {Args} from '@oclif/core'
import {BaseCommand} from '../base-command.js'
import {gatewayHome} from '../../runtime/util/paths.js'
import {revokeApiKey, type ApiKeyInfo} from '../../runtime/state/api-keys.js'

export default class ApiKeyRevoke extends BaseCommand<typeof ApiKeyRevoke> {
  static summary = 'revoke an API key: requests using it get 401 from then on (a running gateway included)'
  static args = {id: Args.string({description: 'the key id shown by `api-key list` (key_...)', required: true})}
  static examples = ['<%= config.bin %> api-key revoke key_1a2b3c4d5e6f']

  async run(): Promise<ApiKeyInfo> {
    const revoked = revokeApiKey({home: gatewayHome(), id: this.args.id})
    this.log(`revoked API key ${revoked.id} (${revoked.name})`)
    return revoked
  }
}
