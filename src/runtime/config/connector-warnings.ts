import type {GatewayConfig} from './types.js'

/** What in the agents' connectors weakens the gateway itself; `config check` and `serve` print each. */
export function connectorConfigWarnings(config: GatewayConfig): Array<{agent: string; warning: string}> {
  return config.agents.flatMap((agent) =>
    agent.connectors.flatMap((connector, index) =>
      connector.type === 'meepachat' && connector.tls_verify === false
        ? [
            {
              agent: agent.id,
              warning:
                `connectors[${index}] (meepachat ${connector.url}): tls_verify is off: any TLS certificate is accepted, ` +
                'so anyone on the network path can read the bot token and the messages and impersonate the server; ' +
                "trust the server's CA instead (SSL_CERT_FILE or NODE_EXTRA_CA_CERTS) and remove tls_verify: false",
            },
          ]
        : [],
    ),
  )
}
