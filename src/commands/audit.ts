import {Flags} from '@oclif/core'
import {BaseCommand} from './base-command.js'
import {gatewayHome} from '../runtime/util/paths.js'
import {listAudit, parseSince, type AuditRecord} from '../runtime/state/audit.js'

export default class Audit extends BaseCommand<typeof Audit> {
  static summary =
    'show the audit log: dashboard logins that failed, password and key changes, every config change made through the API (oldest first)'
  static flags = {
    since: Flags.string({
      description: 'only entries from then on: an ISO date/time or a duration such as 30m, 24h, 7d',
    }),
    limit: Flags.integer({
      char: 'n',
      description: 'at most this many (the newest)',
      default: 1000,
      min: 1,
      max: 100_000,
    }),
  }
  static examples = [
    '<%= config.bin %> audit',
    '<%= config.bin %> audit --since 24h',
    '<%= config.bin %> audit --since 2026-01-01 --json',
  ]

  async run(): Promise<AuditRecord[]> {
    const entries = listAudit({
      home: gatewayHome(),
      since: this.flags.since === undefined ? undefined : parseSince(this.flags.since),
      limit: this.flags.limit,
    })
    if (entries.length === 0) this.log('no audit entries')
    for (const entry of entries) {
      const time = new Date(entry.at).toISOString().replace('T', ' ').slice(0, 19)
      this.log(
        `${time}  ${entry.level === 'warning' ? 'WARNING' : 'info   '}  ${entry.event}  ${entry.principal}${entry.source ? ` from ${entry.source}` : ''}: ${entry.summary}`,
      )
    }
    return entries
  }
}
