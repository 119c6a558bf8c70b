import type {ConnectorConfig} from '../config/types.js'
import type {CatchUpLimits} from './catch-up.js'
import type {DiscordTimings} from './discord.js'
import type {MeepaChatTimings} from './meepachat.js'
import type {SlackTimings} from './slack.js'
import type {Connector, ConnectorContext} from './types.js'

/** Per-platform timing overrides: tests shorten backoffs and pings; production uses the defaults. */
export interface ConnectorTimings {
  catchUp?: CatchUpLimits
  meepachat?: Partial<MeepaChatTimings>
  discord?: Partial<DiscordTimings>
  slack?: Partial<SlackTimings>
}

/**
 * Platform libraries load only for platforms in use: discord.js alone adds ~50 MB of resident
 * memory, the Slack clients ~20 MB, to a gateway that may not need them.
 */
export async function createConnector(
  config: ConnectorConfig,
  context: ConnectorContext,
  timings: ConnectorTimings = {},
): Promise<Connector> {
  switch (config.type) {
    case 'meepachat': {
      const {MeepaChatConnector, DEFAULT_MEEPACHAT_TIMINGS} = await import('./meepachat.js')
      return new MeepaChatConnector(config, context, {...DEFAULT_MEEPACHAT_TIMINGS, ...timings.meepachat})
    }
    case 'discord': {
      const {DiscordConnector, DEFAULT_DISCORD_TIMINGS} = await import('./discord.js')
      return new DiscordConnector(config, context, {...DEFAULT_DISCORD_TIMINGS, ...timings.discord})
    }
    case 'slack': {
      const {SlackConnector, DEFAULT_SLACK_TIMINGS} = await import('./slack.js')
      return new SlackConnector(config, context, {...DEFAULT_SLACK_TIMINGS, ...timings.slack})
    }
  }
}

/** `agent/type`, with `#2`, `#3`... for a second connector of the same type on one agent. */
export function connectorNames(agentId: string, configs: ConnectorConfig[]): string[] {
  const counts = new Map<string, number>()
  return configs.map((config) => {
    const count = (counts.get(config.type) ?? 0) + 1
    counts.set(config.type, count)
    return `${agentId}/${config.type}${count > 1 ? `#${count}` : ''}`
  })
}
