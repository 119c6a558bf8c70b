import {BaseCommand} from '../base-command.js'
import {gatewayHome} from '../../runtime/util/paths.js'
import {listApiKeys, type ApiKeyInfo} from '../../runtime/state/api-keys.js'

export default class ApiKeyList extends BaseCommand<typeof ApiKeyList> {
  static summary = 'list API keys (id, name, kind, the first characters of the key, created, last used, revoked)'
  static examples = ['<%= config.bin %> api-key list', '<%= config.bin %> api-key list --json']

  async run(): Promise<ApiKeyInfo[]> {
    const keys = listApiKeys({home: gatewayHome()})
    if (keys.length === 0) {
      this.log('no API keys; create one with: meepagateway api-key create NAME')
      return keys
    }
    const date = (ms: number | null) => (ms === null ? '-' : new Date(ms).toISOString().replace('T', ' ').slice(0, 16))
    const rows = keys.map((key) => [
      key.id,
      key.name,
      key.kind,
      `${key.key_prefix}…`,
      date(key.created_at),
      date(key.last_used_at),
      key.revoked_at === null ? 'active' : `revoked ${date(key.revoked_at)}`,
    ])
    const header = ['ID', 'NAME', 'KIND', 'KEY', 'CREATED (UTC)', 'LAST USED', 'STATUS']
    const widths = header.map((title, column) =>
      Math.max(title.length, ...rows.map((row) => (row[column] as string).length)),
    )
    for (const row of [header, ...rows])
      this.log(
        row
          .map((cell, column) => cell.padEnd(widths[column] as number))
          .join('  ')
          .trimEnd(),
      )
    return keys
  }
}
