import type {Connector} from '../connectors/types.js'
import type {RunRecord, RunRecords} from '../state/run-records.js'
import {RESTARTED_REPLY} from './user-replies.js'

/** How long a connector may take to connect before its owed replies wait for the next start. */
const CONNECT_WAIT_MS = 120_000
const POLL_MS = 250

/**
 * Tells each user whose run a crashed gateway left unfinished (recorded as interrupted with a
 * connector, channel and thread) that it was lost, on the connector the message came from, once
 * that connector is connected. Each record notes the outcome, so the reply goes out once.
 */
export async function answerInterruptedRuns(options: {
  records: RunRecords
  connectors: Connector[]
  log: (line: string) => void
  signal: AbortSignal
}): Promise<void> {
  const {records, log} = options
  const owed = records.pendingRestartReplies()
  if (owed.length > 0) log(`gateway: telling ${owed.length} user(s) that their message was lost in a restart`)
  await Promise.all(
    groupBy(owed, (run) => `${run.agent_id}\0${run.connector}`).map(async (runs) => {
      const first = runs[0] as RunRecord
      const connector = options.connectors.find(
        (candidate) => candidate.agentId === first.agent_id && candidate.type === first.connector,
      )
      if (!connector) {
        for (const run of runs)
          records.noteRestartReply(run.id, {failed: `agent ${run.agent_id} has no ${run.connector} connector any more`})
        return
      }
      if (!(await connected(connector, options.signal))) return // still pending: the next start-up tries again
      for (const run of runs) {
        try {
          await connector.deliveryTo(run.channel_id, run.thread_id ?? undefined).send(RESTARTED_REPLY)
          records.noteRestartReply(run.id, {sent: true})
          log(
            `run ${run.id}: told ${run.connector} user ${run.user_id ?? '?'} that the gateway restarted before the run finished`,
          )
        } catch (error) {
          const reason = (error as Error).message.split('\n')[0] ?? 'unknown'
          records.noteRestartReply(run.id, {failed: reason})
          log(`run ${run.id}: could not send the restart reply via ${connector.name}: ${reason}`)
        }
      }
    }),
  )
}

async function connected(connector: Connector, signal: AbortSignal): Promise<boolean> {
  const until = Date.now() + CONNECT_WAIT_MS
  while (connector.state !== 'connected') {
    if (signal.aborted || Date.now() > until || connector.state === 'stopped') return false
    await new Promise((resolve) => setTimeout(resolve, POLL_MS).unref())
  }
  return true
}

function groupBy<T>(items: T[], key: (item: T) => string): T[][] {
  const groups = new Map<string, T[]>()
  for (const item of items) groups.set(key(item), [...(groups.get(key(item)) ?? []), item])
  return [...groups.values()]
}
