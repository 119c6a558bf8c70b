import type {ConnectorAudience} from '../config/types.js'

/** Where a message was posted, as far as who-the-agent-listens-to is concerned. */
export interface MessagePlace {
  /** The channel, and for a thread also its parent channel. */
  channelIds: string[]
  isDm: boolean
  /** The message @mentions the bot. */
  mentioned: boolean
}

/**
 * Whether the agent answers a message (config `channels`, `mention_only`): a DM always; in a
 * channel, only one on the allow-list when there is one, and only an @mention under mention_only.
 */
export function listensTo(audience: ConnectorAudience, place: MessagePlace): boolean {
  if (place.isDm) return true
  const allowed = audience.channels ?? []
  if (allowed.length > 0 && !place.channelIds.some((id) => allowed.includes(id))) return false
  return !audience.mention_only || place.mentioned
}
