import type {ConnectorConfig} from '../config/types.js'
import {DEFAULT_DISCORD_TIMINGS, DiscordConnector, type DiscordTimings} from './discord.js'
import {DEFAULT_MEEPACHAT_TIMINGS, MeepaChatConnector, type MeepaChatTimings} from './meepachat.js'
import {DEFAULT_SLACK_TIMINGS, SlackConnector, type SlackTimings} from './slack.js'
import type {Connector, ConnectorContext} from './types.js'

/** Per-platform timing overrides: tests shorten backoffs and pings; production uses the defaults. */
export interface ConnectorTimings {
  meepachat?: Partial<MeepaChatTimings>
  discord?: Partial<DiscordTimings>
  slack?: Partial<SlackTimings>
}

export function createConnector(config: ConnectorConfig, context: ConnectorContext, timings: ConnectorTimings = {}): Connector {
  switch (config.type) {
    case 'meepachat':
      return new MeepaChatConnector(config, context, {...DEFAULT_MEEPACHAT_TIMINGS, ...timings.meepachat})
    case 'discord':
      return new DiscordConnector(config, context, {...DEFAULT_DISCORD_TIMINGS, ...timings.discord})
    case 'slack':
      return new SlackConnector(config, context, {...DEFAULT_SLACK_TIMINGS, ...timings.slack})
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
