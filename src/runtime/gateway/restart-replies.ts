import type {Connector} from '../connectors/types.js'
import type {RunRecords} from '../state/run-records.js'
import type {ReplyOutbox} from './reply-outbox.js'
import {RESTARTED_REPLY} from './user-replies.js'

/**
 * Tells each user whose run a crashed gateway left unfinished (recorded as interrupted with a
 * connector, channel and thread) that it was lost, on the connector the message came from. The
 * reply goes through the outbox like any other, so it waits for the platform as long as any
 * reply would; the record notes it was queued (or why not), so it is queued once.
 */
export function answerInterruptedRuns(options: {
  records: RunRecords
  connectors: readonly Connector[]
  outbox: ReplyOutbox
  log: (line: string) => void
}): void {
  const {records, log} = options
  const owed = records.pendingRestartReplies()
  if (owed.length > 0) log(`gateway: telling ${owed.length} user(s) that their message was lost in a restart`)
  for (const run of owed) {
    const connector = options.connectors.find(
      (candidate) => candidate.agentId === run.agent_id && candidate.type === run.connector,
    )
    if (!connector) {
      records.noteRestartReply(run.id, {failed: `agent ${run.agent_id} has no ${run.connector} connector any more`})
      continue
    }
    try {
      options.outbox.send(
        run.id,
        {connector: connector.name, channelId: run.channel_id, ...(run.thread_id ? {threadId: run.thread_id} : {})},
        RESTARTED_REPLY,
      )
      records.noteRestartReply(run.id, {queued: true})
      log(
        `run ${run.id}: telling ${run.connector} user ${run.user_id ?? '?'} that the gateway restarted before the run finished`,
      )
    } catch (error) {
      const reason = (error as Error).message.split('\n')[0] ?? 'unknown'
      records.noteRestartReply(run.id, {failed: reason})
      log(`run ${run.id}: could not queue the restart reply via ${connector.name}: ${reason}`)
    }
  }
}
