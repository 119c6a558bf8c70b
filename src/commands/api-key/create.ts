import {Args, Flags} from '@oclif/core'
import {BaseCommand} from '../base-command.js'
import {gatewayHome} from '../../runtime/util/paths.js'
import {createApiKey, type CreatedApiKey} from '../../runtime/state/api-keys.js'

export default class ApiKeyCreate extends BaseCommand<typeof ApiKeyCreate> {
  static summary =
    'create an API key: a chat key (POST /api/chat only) or, with --admin, one that may do what the dashboard does; printed once, only its hash is stored'
  static args = {name: Args.string({description: 'a name to recognise the key by', required: true})}
  static flags = {
    admin: Flags.boolean({
      description:
        'an admin key: may change agents, isolation, images and keys through the dashboard API (not the password)',
      default: false,
    }),
  }
  static examples = [
    '<%= config.bin %> api-key create "web widget"',
    '<%= config.bin %> api-key create deploy --admin',
    '<%= config.bin %> api-key create ci --json',
  ]

  async run(): Promise<CreatedApiKey> {
    const created = createApiKey({home: gatewayHome(), name: this.args.name, admin: this.flags.admin})
    this.log(`Created ${created.kind === 'admin' ? 'ADMIN' : 'chat'} API key ${created.id} (${created.name}):`)
    this.log('')
    this.log(`  ${created.key}`)
    this.log('')
    this.log('Copy it now: it is not stored and cannot be shown again.')
    this.log('Use it as: Authorization: Bearer <key>')
    if (created.kind === 'chat')
      this.log('It may use POST /api/chat and read its own runs (GET /api/chat/runs), nothing else.')
    else this.log('It may change agents and isolation levels: keep it like the dashboard password.')
    return created
  }
}
