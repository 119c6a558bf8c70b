import type {IsolationLevel} from '../config/types.js'
import type {AgentRunOutput} from '../shapes/agent-run-contract.js'
import {readGatewayDb, type GatewayDb} from './gateway-db.js'

export type RunStatus = 'running' | 'ok' | 'failed' | 'interrupted' | 'rejected'

export interface RunRecord {
  id: string
  agent_id: string
  connector: string
  channel_id: string
  thread_id: string | null
  message_id: string | null
  user_id: string | null
  isolation: IsolationLevel
  status: RunStatus
  started_at: number
  duration_ms: number | null
  error_code: string | null
  error_message: string | null
  input_tokens: number | null
  output_tokens: number | null
  iterations: number | null
  tool_calls: number | null
  /**
   * For a run a crashed gateway left: `pending`, `queued <ISO time>` (in the outbox: `delivery` says
   * whether it went out; `sent <ISO time>` from older gateways) or `failed: <reason>` (null otherwise).
   */
  restart_reply: string | null
  /** A chat reply's fate: pending (in the outbox), delivered or undeliverable; null when answered in the request. */
  delivery: 'pending' | 'delivered' | 'undeliverable' | null
  /** Why an undeliverable reply could not go out. */
  delivery_error: string | null
}

/** One file that came in with a run's message or went out with its reply: never its content. */
export interface RunFile {
  direction: 'in' | 'out'
  name: string
  /** Null for a file the gateway refused without reading it (a link, a FIFO, past a cap). */
  size: number | null
  content_type: string | null
  /** Why it did not go through (over a cap, refused, failed); null when it did. */
  skipped_reason: string | null
}

/** A run record with its files, as `runs` and the dashboard show it. */
export type RunRecordWithFiles = RunRecord & {files: RunFile[]}

/** Records the files of a run (either direction) in one transaction. */
export function recordRunFiles(
  db: GatewayDb,
  runId: string,
  files: ReadonlyArray<Omit<RunFile, 'skipped_reason'> & {skipped_reason?: string | null}>,
): void {
  if (files.length === 0) return
  const insert = db.prepare(
    `INSERT INTO run_files (run_id, direction, name, size, content_type, skipped_reason)
     VALUES (@runId, @direction, @name, @size, @content_type, @skipped_reason)`,
  )
  db.transaction(() => {
    for (const file of files)
      insert.run({
        runId,
        skipped_reason: null,
        ...file,
        size: file.size === null ? null : Math.max(0, Math.round(file.size)),
      })
  })()
}

/** The files of each run, oldest first within a run, keyed by run id. */
export function runFilesOf(db: GatewayDb, runIds: string[]): Map<string, RunFile[]> {
  const byRun = new Map<string, RunFile[]>(runIds.map((id) => [id, []]))
  if (runIds.length === 0) return byRun
  const rows = db
    .prepare(
      `SELECT run_id, direction, name, size, content_type, skipped_reason FROM run_files
       WHERE run_id IN (SELECT value FROM json_each(?)) ORDER BY rowid`,
    )
    .all(JSON.stringify(runIds)) as Array<RunFile & {run_id: string}>
  for (const {run_id: runId, ...file} of rows) byRun.get(runId)?.push(file)
  return byRun
}

/** Each record with its files. */
export function withFiles(db: GatewayDb, runs: RunRecord[]): RunRecordWithFiles[] {
  const files = runFilesOf(
    db,
    runs.map((run) => run.id),
  )
  return runs.map((run) => ({...run, files: files.get(run.id) ?? []}))
}

/** Connectors whose conversation outlives the gateway, so a late "I was restarted" reply can reach it. */
export const RESTART_REPLY_CONNECTORS = ['meepachat', 'discord', 'slack'] as const

export interface RunStart {
  id: string
  agentId: string
  connector: string
  channelId: string
  threadId?: string
  messageId?: string
  userId?: string
  isolation: IsolationLevel
  startedAt?: number
}

/**
 * The operator's record of every message the gateway handled. A row is inserted as `running`
 * before the run starts and updated when it ends, so a crash or kill mid-run still leaves a
 * row; the next start-up turns stale `running` rows into `interrupted`.
 */
export class RunRecords {
  constructor(private readonly db: GatewayDb) {}

  /** See recordRunFiles. */
  files(runId: string, files: Parameters<typeof recordRunFiles>[2]): void {
    recordRunFiles(this.db, runId, files)
  }

  /** Like list(), each record with the files that came in or went out with it. */
  listWithFiles(options: {agentId?: string; limit?: number} = {}): RunRecordWithFiles[] {
    return withFiles(this.db, this.list(options))
  }

  start(run: RunStart): void {
    this.db
      .prepare(
        `INSERT INTO runs (id, agent_id, connector, channel_id, thread_id, message_id, user_id, isolation, status, started_at)
         VALUES (@id, @agentId, @connector, @channelId, @threadId, @messageId, @userId, @isolation, 'running', @startedAt)`,
      )
      .run({
        threadId: null,
        messageId: null,
        userId: null,
        ...run,
        startedAt: run.startedAt ?? Date.now(),
      })
  }

  /**
   * Records how a started run ended; `interrupted` when the gateway stopped it. False when its row
   * is missing (its start was not recorded).
   */
  finish(
    id: string,
    output: AgentRunOutput,
    options: {durationMs: number; isolation?: IsolationLevel; interrupted?: boolean},
  ): boolean {
    const status: RunStatus = output.ok ? 'ok' : options.interrupted ? 'interrupted' : 'failed'
    return (
      this.db
        .prepare(
          `UPDATE runs SET status = @status, duration_ms = @durationMs, isolation = COALESCE(@isolation, isolation),
           error_code = @errorCode, error_message = @errorMessage, input_tokens = @inputTokens,
           output_tokens = @outputTokens, iterations = @iterations, tool_calls = @toolCalls
         WHERE id = @id`,
        )
        .run({
          id,
          status,
          durationMs: Math.round(options.durationMs),
          isolation: options.isolation ?? null,
          errorCode: output.ok ? null : output.error.code,
          errorMessage: output.ok ? null : output.error.message,
          inputTokens: output.ok ? output.usage.input_tokens : null,
          outputTokens: output.ok ? output.usage.output_tokens : null,
          iterations: output.ok ? output.iterations : null,
          toolCalls: output.ok ? output.tool_calls.length : null,
        }).changes > 0
    )
  }

  /** A message that never ran (queue full, gateway stopping): recorded so the operator sees the loss. */
  reject(run: RunStart, errorCode: string, errorMessage: string): void {
    this.start(run)
    this.db
      .prepare(`UPDATE runs SET status = 'rejected', duration_ms = 0, error_code = ?, error_message = ? WHERE id = ?`)
      .run(errorCode, errorMessage, run.id)
  }

  /**
   * Rows left `running` by a gateway that died; returns how many were marked. Those from a chat
   * platform are marked for a restart reply (see pendingRestartReplies).
   */
  markStaleInterrupted(): number {
    const platforms = RESTART_REPLY_CONNECTORS.map((name) => `'${name}'`).join(', ')
    return this.db
      .prepare(
        `UPDATE runs SET status = 'interrupted', error_code = COALESCE(error_code, 'E_RUN'),
           error_message = COALESCE(error_message, 'the gateway stopped before the run finished'),
           restart_reply = CASE WHEN connector IN (${platforms}) AND channel_id != '' THEN 'pending' ELSE restart_reply END
         WHERE status = 'running'`,
      )
      .run().changes
  }

  /** Interrupted runs whose user has not been told yet, oldest first. */
  pendingRestartReplies(): RunRecord[] {
    return this.db
      .prepare(`SELECT * FROM runs WHERE restart_reply = 'pending' ORDER BY started_at, rowid`)
      .all() as RunRecord[]
  }

  /** Notes that the restart reply is in the outbox (or why it could not be), so it is sent once. */
  noteRestartReply(id: string, outcome: {queued: true} | {failed: string}): void {
    const note = 'queued' in outcome ? `queued ${new Date().toISOString()}` : `failed: ${outcome.failed}`
    this.db.prepare(`UPDATE runs SET restart_reply = ? WHERE id = ?`).run(note, id)
  }

  get(id: string): RunRecord | undefined {
    return this.db.prepare('SELECT * FROM runs WHERE id = ?').get(id) as RunRecord | undefined
  }

  /** One caller's runs on one connector (a web chat key's own conversations), newest first. */
  listByUser(connector: string, userId: string, limit = 50): RunRecord[] {
    return this.db
      .prepare('SELECT * FROM runs WHERE connector = ? AND user_id = ? ORDER BY started_at DESC, rowid DESC LIMIT ?')
      .all(connector, userId, limit) as RunRecord[]
  }

  list(options: {agentId?: string; limit?: number} = {}): RunRecord[] {
    const limit = options.limit ?? 20
    if (options.agentId) {
      return this.db
        .prepare('SELECT * FROM runs WHERE agent_id = ? ORDER BY started_at DESC, rowid DESC LIMIT ?')
        .all(options.agentId, limit) as RunRecord[]
    }
    return this.db.prepare('SELECT * FROM runs ORDER BY started_at DESC, rowid DESC LIMIT ?').all(limit) as RunRecord[]
  }
}

/** `meepagateway runs`: the newest run records with their files, optionally for one agent. */
export function listRuns(options: {home: string; agentId?: string; limit?: number}): RunRecordWithFiles[] {
  return readGatewayDb(options.home, (db) => withFiles(db, new RunRecords(db).list(options)))
}
