import {Flags} from '@oclif/core'
import {BaseCommand} from './base-command.js'
import {serveGateway, type ServeResult} from '../runtime/gateway/serve.js'
import {gatewayHome} from '../runtime/util/paths.js'

export default class Serve extends BaseCommand<typeof Serve> {
  static summary =
    "run the gateway: connect every agent's chat connectors, answer messages, serve /healthz and the web chat API"
  static description =
    'Runs until SIGINT or SIGTERM. Then it stops taking messages, lets running runs finish for gateway.shutdown_grace_seconds ' +
    '(a second signal aborts them at once), records everything in $MEEPAGATEWAY_HOME/gateway.db and exits 0. ' +
    'One gateway per home: while one serves, another serve of the same MEEPAGATEWAY_HOME exits 12 naming its pid.'
  static aliases = ['start']
  static enableJsonFlag = false
  static flags = {
    unrestricted: Flags.boolean({
      description: 'run every agent WITHOUT isolation, for this process only (never written to the config)',
    }),
  }
  static examples = [
    '<%= config.bin %> serve',
    '<%= config.bin %> serve --config ./config.yaml',
    '<%= config.bin %> start --unrestricted',
  ]

  async run(): Promise<ServeResult> {
    const result = await serveGateway({
      home: gatewayHome(),
      loadConfig: () => this.loadConfig(),
      unrestricted: this.flags.unrestricted,
      log: (line) => this.log(line),
    })
    // a library timer or keep-alive socket must not keep a stopped gateway alive
    setTimeout(() => process.exit(0), 2000).unref()
    return result
  }
}
