import {BaseCommand} from '../base-command.js'
import {mintDashboardLink, type DashboardLink} from '../../runtime/captain/link.js'

export default class DashboardLinkCommand extends BaseCommand<typeof DashboardLinkCommand> {
  static summary =
    'print a one-time dashboard login URL (valid 10 minutes); works even when password logins are rate-limited'
  static description =
    'The link is written to gateway.db, which only the operator can read (a sandboxed agent cannot), and its secret travels in the URL fragment, which the browser never sends to a server.'
  static examples = ['<%= config.bin %> dashboard link']

  async run(): Promise<DashboardLink> {
    const link = mintDashboardLink(this.loadConfig())
    this.log(link.url)
    this.logToStderr(`Open it within ${Math.round(link.expires_in_s / 60)} minutes; it works once.`)
    return link
  }
}
