import fs from 'node:fs'
import path from 'node:path'
import {parseConfigText} from '../config/load.js'
import type {GatewayConfig, LoadedConfig} from '../config/types.js'

/** Quiet time after the last change event before the file is read: an editor writes in several steps. */
const SETTLE_MS = 150
/**
 * How often the file is read anyway: events are lost on some file systems, and a symlinked file's
 * target is not watched.
 */
const POLL_MS = 2000

export interface ConfigWatchOptions {
  /** The config the gateway runs now: a file that reads as its text has not changed. */
  current: () => LoadedConfig
  /** A valid new text, parsed: the gateway applies it (runs, standbys, dashboard, audit). */
  apply: (next: LoadedConfig) => void
  log: (line: string) => void
  env?: NodeJS.ProcessEnv
}

/**
 * `serve`'s watch on config.yaml: a hand edit that validates is applied to the next message of each
 * agent; one that does not is refused, logged with its problems, and the running config stays.
 * Watching the directory (not the file) sees an editor that replaces the file by a rename.
 */
export class ConfigWatch {
  private watcher: fs.FSWatcher | undefined
  private readonly poll: NodeJS.Timeout
  private settle: NodeJS.Timeout | undefined
  private lastRead: string | undefined
  /** The text last refused and why, so one bad edit is logged once. */
  private refused: {text: string; reason: string} | undefined

  constructor(private readonly options: ConfigWatchOptions) {
    const file = options.current().path
    try {
      this.watcher = fs.watch(path.dirname(file), {persistent: false}, (_event, name) => {
        if (name === null || name === path.basename(file)) this.schedule()
      })
      this.watcher.on('error', (error) => this.stopWatching(error))
    } catch (error) {
      this.stopWatching(error as Error)
    }
    // a read that differs from the last one waits for the file to settle, like an event
    this.poll = setInterval(() => {
      const text = this.read()
      if (text !== this.lastRead) this.schedule()
    }, POLL_MS).unref()
    // changed while the gateway started: caught up at once
    this.lastRead = options.current().text
    if (this.read() !== this.lastRead) this.schedule()
  }

  /**
   * Reads the file now and applies or refuses what changed (a dashboard edit and `send` call this
   * first, so they never act on a file the gateway has not caught up with). Returns why the file's
   * current text is refused, or undefined when the gateway runs it.
   */
  sync(): string | undefined {
    const current = this.options.current()
    const text = this.read()
    this.lastRead = text
    if (text === undefined) return this.refuse('', `cannot read ${current.path}`)
    if (text === current.text) {
      if (this.refused) this.options.log(`gateway: ${current.path} reads as the running config again`)
      this.refused = undefined
      return undefined
    }
    if (text === this.refused?.text) return this.refused.reason
    let parsed: {config: GatewayConfig; secrets: Record<string, string>}
    try {
      parsed = parseConfigText(text, current.path, this.options.env ?? process.env)
    } catch (error) {
      return this.refuse(
        text,
        (error as Error).message.replace(/:?\n\s*-\s*/g, (separator) => (separator.startsWith(':') ? ': ' : '; ')),
      )
    }
    this.refused = undefined
    // variables named in the file are read from this process's environment, as at start-up
    this.options.apply({
      ...current,
      config: parsed.config,
      secrets: {...current.secrets, ...parsed.secrets},
      created: false,
      text,
    })
    return undefined
  }

  close(): void {
    clearTimeout(this.settle)
    clearInterval(this.poll)
    this.watcher?.close()
  }

  private schedule(): void {
    clearTimeout(this.settle)
    this.settle = setTimeout(() => {
      try {
        this.sync()
      } catch (error) {
        // applying failed half way (it should not): said, and the gateway goes on serving
        this.options.log(
          `gateway: could not apply the change to ${this.options.current().path}: ${(error as Error).message}`,
        )
      }
    }, SETTLE_MS).unref()
  }

  private refuse(text: string, reason: string): string {
    if (this.refused?.text !== text || this.refused.reason !== reason) {
      this.options.log(
        `gateway: config change refused, still serving the previous config: ${reason} (meepagateway config check shows the problems)`,
      )
    }
    this.refused = {text, reason}
    return reason
  }

  private read(): string | undefined {
    try {
      return fs.readFileSync(this.options.current().path, 'utf8')
    } catch {
      return undefined
    }
  }

  private stopWatching(error: Error): void {
    this.watcher?.close()
    this.watcher = undefined
    this.options.log(
      `gateway: cannot watch ${path.dirname(this.options.current().path)} (${error.message}); config.yaml is read every ${POLL_MS / 1000} s instead`,
    )
  }
}

/**
 * What a running gateway set up once from the config (connectors, listener, queue): a change there
 * waits for a restart.
 */
export function partsNeedingRestart(before: GatewayConfig, after: GatewayConfig): string[] {
  const parts: string[] = []
  const agentsBefore = new Map(before.agents.map((agent) => [agent.id, agent]))
  const agentsAfter = new Map(after.agents.map((agent) => [agent.id, agent]))
  for (const id of agentsAfter.keys()) if (!agentsBefore.has(id)) parts.push(`agent ${id} (added)`)
  for (const [id, agent] of agentsBefore) {
    const next = agentsAfter.get(id)
    if (!next) parts.push(`agent ${id} (removed)`)
    else if (JSON.stringify(next.connectors) !== JSON.stringify(agent.connectors))
      parts.push(`agent ${id}'s connectors`)
  }
  for (const section of ['captain', 'gateway'] as const) {
    for (const [field, value] of Object.entries(after[section])) {
      // the listener reads allowed_hosts at every request, the web chat and the outbox their budgets
      if (section === 'captain' && field === 'allowed_hosts') continue
      if (section === 'gateway' && ['max_queued_chat_files_size', 'max_outbox_spool_size'].includes(field)) continue
      if (JSON.stringify(value) !== JSON.stringify((before[section] as Record<string, unknown>)[field]))
        parts.push(`${section}.${field}`)
    }
  }
  return parts
}
