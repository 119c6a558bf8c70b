import {setTimeout as sleep} from 'node:timers/promises'
import {Backoff, formatDelay, type BackoffOptions} from '../connectors/backoff.js'
import {asDeliveryError, type DeliveryError} from '../connectors/delivery-error.js'
import {splitMessage} from '../connectors/split-message.js'
import type {Connector, Conversation, ReplyPacing} from '../connectors/types.js'
import type {GatewayDb} from '../state/gateway-db.js'
import {Outbox, type OutboxReply, type PendingPart} from '../state/outbox.js'
import {OutboxSpool} from '../state/outbox-spool.js'
import type {FileRefusal, OutboundFile} from '../shapes/outbound-file.js'
import {describeSize} from '../config/attachment-caps.js'
import {undeliveredRestReply} from './user-replies.js'
import {sharedAbortController} from '../util/shared-abort.js'

/** Between attempts when the platform names no wait: 1 s, doubling, at most a minute. */
const DEFAULT_RETRY_BACKOFF: BackoffOptions = {initialMs: 1000, maxMs: 60_000}
/** How long stop() lets replies in flight finish before it leaves the rest for the next start. */
const STOP_WAIT_MS = 5_000

export interface ReplyOutboxOptions {
  db: GatewayDb
  /** Where the files replies carry wait for delivery (`<home>/spool/outbox`). */
  spoolDir: string
  connectors: () => readonly Connector[]
  /** How long a reply is retried from when it was written (gateway.reply_delivery_minutes). */
  deliveryWindowMs: () => number
  /** Bytes of files the spool may keep (gateway.max_outbox_spool_size); unset: no bound. */
  spoolLimitBytes?: () => number
  log: (line: string) => void
  retryBackoff?: BackoffOptions
}

/**
 * Delivers chat replies through the durable outbox (state/outbox.ts). Each conversation has its
 * own lane: its replies go out one after another, each part (a file, a chunk of text) in order
 * and none skipped, while other conversations' lanes go on. A failed attempt waits the
 * platform's Retry-After (or a backoff) and tries again, across reconnects and restarts, until
 * the delivery window closes; then the reply is undeliverable: logged at WARNING, recorded on its
 * run, counted by /healthz.
 * A file the platform refuses for good (too large) costs only itself: the text says so.
 * Posts through one connector are paced under its platform's documented rate.
 */
export class ReplyOutbox {
  private readonly store: Outbox
  private readonly lanes = new Map<string, Promise<void>>()
  private readonly pacers = new Map<string, Pacer>()
  private readonly stopping = sharedAbortController()
  /** Lanes waiting out a Retry-After or backoff: stop() does not wait for them. */
  private waiting = 0
  private idleWaiters: Array<() => void> = []

  constructor(private readonly options: ReplyOutboxOptions) {
    this.store = new Outbox(options.db, new OutboxSpool(options.spoolDir))
  }

  /**
   * Writes the reply, its files first (their bytes copied to the spool now, so what goes out is
   * what the run produced) and then its text split to the connector's message limit, and starts
   * its delivery. Throws only when the outbox cannot be written (the caller then sends directly).
   */
  send(runId: string, conversation: Conversation, text: string, files: OutboundFile[] = []): void {
    const connector = this.connector(conversation.connector)
    const chunks = connector ? splitMessage(text, connector.messageLimit) : [text]
    this.store.add(runId, conversation, [
      ...files.map((file) => ({kind: 'file' as const, file})),
      ...chunks.map((content) => ({kind: 'text' as const, content})),
    ])
    this.wake(conversation)
  }

  /**
   * Which of a reply's files the spool can take, in order, within gateway.max_outbox_spool_size
   * with what replies still owe: the spool is outside every agent's limits.disk, so without a
   * bound an agent's replies could outpace a slow or failing platform and fill the home's disk.
   * The others are refused, with the reason the reply's text gives.
   */
  spoolRoom(files: OutboundFile[]): {files: OutboundFile[]; refused: FileRefusal[]} {
    const limit = this.options.spoolLimitBytes?.() ?? Infinity
    let used: number
    try {
      used = this.store.spooledBytes()
    } catch {
      return {files, refused: []} // the outbox cannot be read: its write fails too, and the reply goes out directly
    }
    const kept: OutboundFile[] = []
    const refused: FileRefusal[] = []
    for (const file of files) {
      if (used + file.size <= limit) {
        kept.push(file)
        used += file.size
        continue
      }
      refused.push({
        name: file.name,
        reason:
          `the gateway's outgoing file spool is full (replies not yet delivered hold ${describeSize(used)} ` +
          `of its ${describeSize(limit)}, gateway.max_outbox_spool_size, and the file is ${describeSize(file.size)}); ` +
          "ask for it again once they are delivered, or the gateway's operator can raise gateway.max_outbox_spool_size",
      })
    }
    return {files: kept, refused}
  }

  /**
   * Starts delivering what a previous gateway left in the outbox, after removing the spooled
   * files no reply owes any more; returns how many replies.
   */
  resume(): number {
    const swept = this.store.sweepSpool()
    if (swept > 0) this.options.log(`gateway: removed ${swept} spooled file(s) no reply owes any more`)
    const pending = this.store.pending()
    if (pending.length > 0)
      this.options.log(`gateway: delivering ${pending.length} reply(ies) a previous gateway left in the outbox`)
    for (const reply of pending) this.wake(reply)
    return pending.length
  }

  get pending(): number {
    return this.store.pendingCount
  }

  /** Replies given up on since `since` (ms since epoch). */
  undeliverableSince(since: number): number {
    return this.store.undeliverableSince(since)
  }

  /** Resolves when no reply is being delivered (the outbox may still hold none or some for later). */
  idle(): Promise<void> {
    if (this.lanes.size === 0) return Promise.resolve()
    return new Promise((resolve) => this.idleWaiters.push(resolve))
  }

  /**
   * Lets replies being posted finish for a moment (a "restarting" reply among them), then stops;
   * what is left, and what waits for a retry, stays in the outbox for the next start.
   */
  async stop(waitMs = STOP_WAIT_MS): Promise<void> {
    const until = Date.now() + waitMs
    while (this.lanes.size > this.waiting && Date.now() < until) await sleep(25, undefined, {ref: false})
    this.stopping.abort()
    // an attempt in flight ends on its own request timeout; its lane then sees the stop
    await Promise.race([this.idle(), sleep(waitMs, undefined, {ref: false})])
  }

  private connector(name: string): Connector | undefined {
    return this.options.connectors().find((candidate) => candidate.name === name)
  }

  private wake(conversation: Omit<Conversation, 'connector'> & {connector: string}): void {
    if (this.stopping.signal.aborted) return
    const key = JSON.stringify([conversation.connector, conversation.channelId, conversation.threadId ?? null])
    if (this.lanes.has(key)) return // the running lane reads the outbox again before it ends
    const address = {
      connector: conversation.connector,
      channelId: conversation.channelId,
      ...(conversation.threadId ? {threadId: conversation.threadId} : {}),
    }
    const lane = this.runLane(address)
      .catch((error: Error) =>
        this.options.log(
          `gateway: delivery to ${address.connector} stopped: ${error.message} (resumed at the next start)`,
        ),
      )
      .finally(() => {
        this.lanes.delete(key)
        if (this.lanes.size > 0) return
        const waiters = this.idleWaiters
        this.idleWaiters = []
        for (const resolve of waiters) resolve()
      })
    this.lanes.set(key, lane)
  }

  private async runLane(address: Conversation): Promise<void> {
    for (;;) {
      if (this.stopping.signal.aborted) return
      const reply = this.store.next(address)
      if (!reply) return
      await this.deliver(reply)
    }
  }

  private async deliver(reply: OutboxReply): Promise<void> {
    const {log} = this.options
    const where = `${reply.connector} (channel ${reply.channelId}${reply.threadId ? `, thread ${reply.threadId}` : ''})`
    const connector = this.connector(reply.connector)
    if (!connector) return this.giveUp(reply, undefined, `the connector ${reply.connector} is no longer configured`)
    const backoff = new Backoff(this.options.retryBackoff ?? DEFAULT_RETRY_BACKOFF)
    let failures = 0
    for (;;) {
      const part = this.store.nextPart(reply.id)
      if (!part) {
        this.store.finish(reply, {delivered: true})
        if (failures > 0 || reply.attempts > 0)
          log(`run ${reply.runId}: reply delivered via ${where} after ${reply.attempts + failures} failed attempt(s)`)
        return
      }
      let failure: DeliveryError
      try {
        const refusal = await this.post(connector, reply, part)
        if (refusal !== undefined && part.kind === 'file') {
          this.refuseFile(reply, part, refusal, connector)
          continue
        }
        this.store.partSent(reply.id, part)
        backoff.reset()
        continue
      } catch (error) {
        if (this.stopping.signal.aborted) return
        failure = asDeliveryError(error)
      }
      const reason = failure.message.split('\n')[0] ?? 'unknown'
      if (!failure.retry && part.kind === 'file') {
        this.refuseFile(reply, part, reason, connector)
        continue
      }
      if (!failure.retry) return this.giveUp(reply, connector, reason)
      const wait = failure.retryAfterMs ?? backoff.next()
      const deadline = reply.createdAt + this.options.deliveryWindowMs()
      if (Date.now() + wait > deadline)
        return this.giveUp(
          reply,
          connector,
          `${reason} (still failing ${formatDelay(Date.now() - reply.createdAt)} after the reply was written)`,
        )
      failures++
      this.store.attemptFailed(reply.id, reason)
      if (failures === 1)
        log(
          `run ${reply.runId}: reply via ${where} not delivered yet: ${reason}; retrying in ${formatDelay(wait)}, ` +
            `until ${new Date(deadline).toISOString()}`,
        )
      this.waiting++
      try {
        await sleep(wait, undefined, {signal: this.stopping.signal, ref: false})
      } catch {
        return // stopping: the reply stays in the outbox for the next start
      } finally {
        this.waiting--
      }
    }
  }

  /**
   * One attempt at one part. A file is read from the spool first; returns why a file cannot be
   * sent at all (its copy is gone, the platform takes no files), undefined once the platform took it.
   */
  private async post(connector: Connector, reply: OutboxReply, part: PendingPart): Promise<string | undefined> {
    if (part.kind === 'text') {
      await this.pace(connector)
      await connector.postMessage(reply, part.content)
      return undefined
    }
    if (!connector.postFile) return 'this conversation cannot carry files'
    const read = this.store.readFile(part)
    if ('problem' in read) return read.problem
    await this.pace(connector)
    await connector.postFile(reply, read.file)
    return undefined
  }

  /** A file that cannot go out: the rest of the reply still does, with a note naming it and why. */
  private refuseFile(
    reply: OutboxReply,
    part: PendingPart & {kind: 'file'},
    reason: string,
    connector: Connector,
  ): void {
    this.store.fileRefused(reply, part, reason, connector.messageLimit)
    // quoted like the dispatcher's: a platform's words must not start a log line of their own
    this.options.log(`run ${reply.runId}: file ${JSON.stringify(part.name)} not sent: ${JSON.stringify(reason)}`)
  }

  /**
   * Records the reply as undeliverable. When part of it went out, or the platform refused one part,
   * the user is told once that the rest is missing (best effort: the platform may be down).
   */
  private async giveUp(reply: OutboxReply, connector: Connector | undefined, reason: string): Promise<void> {
    const sent = this.store.sentParts(reply.id)
    this.store.finish(reply, {undeliverable: reason})
    this.options.log(
      `WARNING run ${reply.runId}: the reply via ${reply.connector} could not be delivered: ${reason}` +
        (sent > 0 ? ` (${sent} part(s) had gone out)` : ''),
    )
    if (!connector) return
    try {
      await this.pace(connector)
      await connector.postMessage(reply, undeliveredRestReply(reply.runId, sent > 0))
    } catch {
      // the platform did not take the notice either; the run record and the log tell the operator
    }
  }

  private async pace(connector: Connector): Promise<void> {
    let pacer = this.pacers.get(connector.name)
    if (!pacer) this.pacers.set(connector.name, (pacer = new Pacer(connector.pacing)))
    const wait = pacer.take()
    if (wait > 0) await sleep(wait, undefined, {ref: false})
  }
}

/** A token bucket: `burst` posts at once, refilled at `perSecond`; take() says how long to wait for a turn. */
class Pacer {
  private tokens: number
  private last = Date.now()

  constructor(private readonly pacing: ReplyPacing) {
    this.tokens = pacing.burst
  }

  take(): number {
    const now = Date.now()
    this.tokens = Math.min(this.pacing.burst, this.tokens + ((now - this.last) / 1000) * this.pacing.perSecond)
    this.last = now
    this.tokens -= 1
    return this.tokens >= 0 ? 0 : Math.ceil((-this.tokens / this.pacing.perSecond) * 1000)
  }
}
