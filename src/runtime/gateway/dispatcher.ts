import type {AgentRunOutput, InboundMessage, MessageAttachment} from '../shapes/agent-run-contract.js'
import {skippedFilesNote, type IncomingFile} from '../connectors/attachments.js'
import type {IsolationLevel} from '../config/types.js'
import type {
  Delivery,
  DispatchExtras,
  DispatchOutcome,
  DispatchStatus,
  DispatchTicket,
  MessageDispatcher,
} from '../connectors/types.js'
import type {RunMessageResult} from '../runners/run-message.js'
import {failure} from '../agent-run/output.js'
import {errorCode} from '../util/errors.js'
import {displayName} from '../workspace/files-to-send.js'
import {abortSignalName} from '../util/subprocess.js'
import type {RunRecords, RunStart} from '../state/run-records.js'
import type {ReplyOutbox} from './reply-outbox.js'
import type {FileToSend} from '../shapes/agent-run-contract.js'
import {refusalNote, type FileRefusal, type OutboundFile} from '../shapes/outbound-file.js'
import type {RunQueue} from './run-queue.js'
import {BUSY_REPLY, EMPTY_REPLY, INTERRUPTED_REPLY, RESTARTING_REPLY, failureReply} from './user-replies.js'

/** A message waiting for its turn: its level is not known until then (the config may change meanwhile). */
type QueuedRun = Omit<RunStart, 'isolation'>

/** How long aborted runs get to report back before shutdown goes on without them. */
const ABORT_SETTLE_MS = 10_000

const sleep = (ms: number) => new Promise<void>((resolve) => setTimeout(resolve, ms).unref())

/** Runs one message for one agent: `runMessage` in production, a stub in queueing tests. */
export type RunFunction = (request: {
  agentId: string
  message: InboundMessage
  runId: string
  /** The level the dispatcher recorded for this run: the runner uses it, never works it out again. */
  isolation: IsolationLevel
  signal: AbortSignal
  onLog?: (line: string) => void
  /** The message's files: the run receives them into the workspace before the agent starts. */
  files?: IncomingFile[]
}) => Promise<RunMessageResult & {attachments?: MessageAttachment[]}>

export interface DispatcherOptions {
  queue: RunQueue
  records: RunRecords
  run: RunFunction
  /** The level a run of this agent uses now: asked once per message, when its record is written. */
  isolationFor: (agentId: string) => IsolationLevel
  newRunId: () => string
  log: (line: string) => void
  /** Told after each run-record write, with the error when it failed (/healthz shows it). */
  onRecordWrite?: (error?: unknown) => void
  /** Where chat platform replies go (a Delivery with a `conversation`); without it they are sent directly. */
  outbox?: ReplyOutbox
  /** The gateway's own read of the files a run asked to send (within the agent's caps); never throws. */
  readFiles?: (agentId: string, requested: FileToSend[]) => {files: OutboundFile[]; refused: FileRefusal[]}
}

const NO_FILES_HERE = 'this conversation cannot carry files'

/**
 * message → agent queue → run → reply through the same connector, with a run record for
 * every message: inserted as `running` before the run, updated when it ends.
 */
export class Dispatcher implements MessageDispatcher {
  private stopping = false
  private readonly inFlight = new Set<AbortController>()
  private endGrace: (() => void) | undefined
  private readonly rejections = new Set<Promise<void>>()

  constructor(private readonly options: DispatcherOptions) {}

  get accepting(): boolean {
    return !this.stopping
  }

  dispatch(agentId: string, message: InboundMessage, delivery: Delivery, extras: DispatchExtras = {}): DispatchTicket {
    const runId = this.options.newRunId()
    const start: QueuedRun = {
      id: runId,
      agentId,
      connector: message.connector,
      channelId: message.channel_id,
      threadId: message.thread_id,
      messageId: message.id,
      userId: message.user.id,
    }
    if (this.stopping) return this.reject(start, delivery, 'stopping', 'the gateway is shutting down')

    let settle!: (outcome: DispatchOutcome) => void
    const done = new Promise<DispatchOutcome>((resolve) => (settle = resolve))
    const accepted = this.options.queue.submit(agentId, {
      run: async () => {
        extras.onTurn?.()
        settle(
          extras.signal?.aborted
            ? this.withdrawn(start, extras.signal)
            : (this.handedBack(start, extras) ?? (await this.execute(start, message, delivery, extras))),
        )
      },
      cancel: (reason) =>
        reason === 'withdrawn' && extras.signal
          ? settle(this.withdrawn(start, extras.signal))
          : void this.reject(start, delivery, 'stopping', 'the gateway shut down before the run started').done.then(
              settle,
            ),
      withdrawn: extras.signal,
    })
    if (!accepted) {
      this.options.log(`agent ${agentId}: queue full, told ${message.connector} user ${message.user.id} to try again`)
      return this.reject(
        start,
        delivery,
        'busy',
        `the agent's queue is full (${this.options.queue.waitingFor(agentId)} waiting)`,
      )
    }
    return {runId, accepted: true, done}
  }

  /**
   * Stops taking messages, drops those not started, lets running ones finish for `graceMs`,
   * then aborts them (their records end as `interrupted`).
   */
  async drain(graceMs: number): Promise<{aborted: number}> {
    this.stopping = true
    this.options.queue.cancelWaiting()
    let timer: NodeJS.Timeout | undefined
    const graceOver = new Promise<'timeout'>((resolve) => {
      timer = setTimeout(() => resolve('timeout'), graceMs)
      this.endGrace = () => resolve('timeout')
    })
    const result = await Promise.race([this.options.queue.idle().then(() => 'idle' as const), graceOver])
    clearTimeout(timer)
    let aborted = 0
    if (result !== 'idle') {
      aborted = this.inFlight.size
      this.abortRuns()
      // runners kill their process group on abort; still, never let a stuck run hold the exit
      await Promise.race([this.options.queue.idle(), sleep(ABORT_SETTLE_MS)])
    }
    await Promise.race([Promise.allSettled([...this.rejections]), sleep(ABORT_SETTLE_MS)])
    return {aborted}
  }

  /** Aborts every running run now; during drain() this also ends the grace period. */
  abortRuns(): void {
    for (const controller of this.inFlight) controller.abort(new Error('the gateway is shutting down'))
    this.endGrace?.()
  }

  private reject(queued: QueuedRun, delivery: Delivery, because: 'busy' | 'stopping', reason: string): DispatchTicket {
    const start = this.recorded(queued)
    this.writeRecord(start.id, () => this.options.records.reject(start, 'E_BUSY', reason))
    const reply = because === 'busy' ? BUSY_REPLY : RESTARTING_REPLY
    const delivered = this.deliver(start, delivery, reply)
    // drain() waits for these too, so a "restarting" reply goes out before the connectors close
    this.rejections.add(delivered)
    void delivered.then(() => this.rejections.delete(delivered))
    const done = delivered.then((): DispatchOutcome => ({
      runId: start.id,
      status: 'rejected',
      reply,
      rejectedBecause: because,
    }))
    return {runId: start.id, accepted: false, done}
  }

  private async execute(
    queued: QueuedRun,
    message: InboundMessage,
    delivery: Delivery,
    extras: DispatchExtras,
  ): Promise<DispatchOutcome> {
    // the level now: a config change while the message waited applies to its run, and its record says so
    const start = this.recorded(queued)
    const controller = new AbortController()
    const forward = () => controller.abort(extras.signal?.reason)
    extras.signal?.addEventListener('abort', forward)
    if (extras.signal?.aborted) forward()
    this.inFlight.add(controller)
    const started = Date.now()
    const stopTyping = delivery.startTyping()
    let output: AgentRunOutput
    let level = start.isolation
    let attachments: MessageAttachment[] | undefined
    // a record that cannot be written (damaged or full disk) is logged; the message still runs
    this.writeRecord(start.id, () => this.options.records.start({...start, startedAt: started}))
    try {
      const result = await this.options.run({
        agentId: start.agentId,
        message,
        runId: start.id,
        isolation: start.isolation,
        signal: controller.signal,
        onLog: extras.onLog,
        ...(extras.files?.length ? {files: extras.files} : {}),
      })
      output = result.output
      level = result.level
      attachments = result.attachments
    } catch (error) {
      output = failure(start.id, 'E_INTERNAL', (error as Error).message)
    } finally {
      stopTyping()
      extras.signal?.removeEventListener('abort', forward)
      this.inFlight.delete(controller)
    }
    const interrupted = controller.signal.aborted && !output.ok
    const durationMs = Date.now() - started
    this.writeRecord(start.id, () =>
      this.options.records.finish(start.id, output, {durationMs, isolation: level, interrupted}),
    )
    if (attachments?.length)
      this.writeRecord(start.id, () =>
        this.options.records.files(
          start.id,
          (attachments ?? []).map(({name, size, content_type, skipped}) => ({
            direction: 'in' as const,
            name,
            size,
            content_type,
            skipped_reason: skipped ?? null,
          })),
        ),
      )
    const status: DispatchStatus = output.ok ? 'ok' : interrupted ? 'interrupted' : 'failed'
    const answer = output.ok
      ? output.reply.content.trim() || EMPTY_REPLY
      : interrupted
        ? INTERRUPTED_REPLY
        : failureReply(output)
    // a file that did not reach the agent is named to the user whatever the agent said
    const reply = [answer, skippedFilesNote(attachments)].filter(Boolean).join('\n\n')
    this.options.log(
      `run ${start.id}: agent ${start.agentId} via ${start.connector} ${status} in ${durationMs} ms (${level})` +
        (output.ok ? '' : `: ${output.error.code} ${output.error.message.split('\n')[0]}`),
    )
    const requested = output.ok ? (output.files ?? []) : []
    if (requested.length === 0) {
      await this.deliver(start, delivery, reply)
      return {runId: start.id, status, reply, output, ...(attachments ? {attachments} : {})}
    }
    const sent = await this.deliverWithFiles(start, delivery, reply, requested)
    return {runId: start.id, status, reply: sent, output, ...(attachments ? {attachments} : {})}
  }

  /**
   * The reply with the files the run asked for: the gateway reads them now, as the run ends (never
   * through the agent), and a chat platform's reply carries them through the outbox, which keeps
   * its own copy of their bytes; web chat (or a chat reply the outbox cannot take) gets them at
   * once. Every file not sent is named in the text and recorded with its reason. Returns the text.
   */
  private async deliverWithFiles(
    start: RunStart,
    delivery: Delivery,
    reply: string,
    requested: FileToSend[],
  ): Promise<string> {
    let read: {files: OutboundFile[]; refused: FileRefusal[]}
    try {
      read = this.options.readFiles?.(start.agentId, requested) ?? {files: [], refused: []}
    } catch (error) {
      const refusal = {reason: `the gateway could not read it (${errorCode(error)})`, detail: (error as Error).message}
      read = {files: [], refused: requested.map(({path}) => ({name: displayName(path), ...refusal}))}
    }
    let {files} = read
    const refused = [...read.refused]
    const {outbox} = this.options
    const throughOutbox = Boolean(delivery.conversation && outbox)
    if (files.length > 0 && !throughOutbox && !delivery.sendWithFiles) {
      refused.push(...files.map((file) => ({name: file.name, reason: NO_FILES_HERE})))
      files = []
    }
    if (files.length > 0 && throughOutbox && outbox) {
      const room = outbox.spoolRoom(files)
      files = room.files
      refused.push(...room.refused)
    }
    const text = reply + refusalNote(refused)
    for (const refusal of refused) this.logRefusal(start.id, refusal)
    const record = (refusedLater: FileRefusal[]) =>
      this.writeRecord(start.id, () =>
        this.options.records.files(start.id, [
          ...files.map((file) => ({
            direction: 'out' as const,
            name: file.name,
            size: file.size,
            content_type: file.content_type,
            skipped_reason: refusedLater.find((refusal) => refusal.name === file.name)?.reason ?? null,
          })),
          ...refused.map((refusal) => ({
            direction: 'out' as const,
            name: refusal.name,
            size: null,
            content_type: null,
            skipped_reason: refusal.reason,
          })),
        ]),
      )
    if (files.length === 0) {
      record([])
      await this.deliver(start, delivery, text)
      return text
    }
    if (delivery.conversation && outbox) {
      // recorded as sent first: the outbox marks those the platform refuses, as it learns it
      record([])
      try {
        outbox.send(start.id, delivery.conversation, text, files)
        return text
      } catch (error) {
        this.options.log(
          `run ${start.id}: could not write the reply to the outbox, sending it once directly: ${(error as Error).message}`,
        )
      }
    }
    let refusedByPlatform: FileRefusal[]
    try {
      refusedByPlatform = (await delivery.sendWithFiles?.(text, files)) ?? []
    } catch (error) {
      this.options.log(`run ${start.id}: could not send the reply via ${start.connector}: ${(error as Error).message}`)
      refusedByPlatform = files.map((file) => ({name: file.name, reason: `not sent: ${(error as Error).message}`}))
    }
    for (const refusal of refusedByPlatform) this.logRefusal(start.id, refusal)
    if (!throughOutbox) record(refusedByPlatform)
    return text + refusalNote(refusedByPlatform)
  }

  /** Quoted: the agent's file name and a platform's words must not start a log line of their own. */
  private logRefusal(runId: string, {name, reason, detail}: FileRefusal): void {
    const why = JSON.stringify(reason) + (detail ? ` (${JSON.stringify(detail)})` : '')
    this.options.log(`run ${runId}: file ${JSON.stringify(name)} not sent: ${why}`)
  }

  /** A message whose sender would now run it differently from this gateway: back to the sender unrun. */
  private handedBack(start: QueuedRun, extras: DispatchExtras): DispatchOutcome | undefined {
    const reason = extras.notRunBecause?.()
    if (reason === undefined) return undefined
    this.options.log(`run ${start.id}: agent ${start.agentId} via ${start.connector} handed back unrun: ${reason}`)
    return {runId: start.id, status: 'rejected', reply: '', notRunBecause: reason}
  }

  /**
   * A message its sender gave up on (Ctrl-C, `send` gone) before its run started: recorded as
   * interrupted, nothing ran.
   */
  private withdrawn(queued: QueuedRun, signal: AbortSignal): DispatchOutcome {
    const start = this.recorded(queued)
    const signalName = abortSignalName(signal.reason)
    const output = failure(
      start.id,
      'E_RUN',
      `the run was cancelled${signalName ? ` (${signalName})` : ''} before it started`,
      true,
      signalName ? {signal: signalName} : {},
    )
    this.writeRecord(start.id, () => this.options.records.start({...start, startedAt: Date.now()}))
    this.writeRecord(start.id, () => this.options.records.finish(start.id, output, {durationMs: 0, interrupted: true}))
    this.options.log(
      `run ${start.id}: agent ${start.agentId} via ${start.connector} withdrawn by its sender before it started`,
    )
    return {runId: start.id, status: 'interrupted', reply: INTERRUPTED_REPLY, output}
  }

  /** The run's record as it starts: the level is worked out here, once, when the message's turn comes. */
  private recorded(queued: QueuedRun): RunStart {
    return {...queued, isolation: this.options.isolationFor(queued.agentId)}
  }

  /** `write` returns false when it wrote nothing (a finish whose start was lost): not a sign of health. */
  private writeRecord(runId: string, write: () => boolean | void): void {
    try {
      if (write() === false) return
      this.options.onRecordWrite?.()
    } catch (error) {
      this.options.log(`run ${runId}: could not write its record (the run goes on): ${(error as Error).message}`)
      this.options.onRecordWrite?.(error)
    }
  }

  /**
   * A chat platform's reply goes to the outbox and the run's turn ends here: its delivery, however
   * long the platform makes it wait, never holds the agent's queue. Web chat and local send answer
   * in their own response.
   */
  private async deliver(start: RunStart, delivery: Delivery, text: string): Promise<void> {
    const {outbox} = this.options
    if (delivery.conversation && outbox) {
      try {
        outbox.send(start.id, delivery.conversation, text)
        return
      } catch (error) {
        this.options.log(
          `run ${start.id}: could not write the reply to the outbox, sending it once directly: ${(error as Error).message}`,
        )
      }
    }
    try {
      await delivery.send(text)
    } catch (error) {
      this.options.log(`run ${start.id}: could not send the reply via ${start.connector}: ${(error as Error).message}`)
    }
  }
}
