import type Database from 'better-sqlite3'
import fs from 'node:fs'
import path from 'node:path'
import {GatewayError} from '../util/errors.js'
import {openSqlite} from '../util/sqlite.js'
import {isSqliteDamage} from '../state/sqlite-damage.js'
import type {ChatMessage} from '../shapes/provider-types.js'

/** Per-channel history is bounded so prompts stay small; oldest entries go first. */
export const HISTORY_LIMIT = 40

export interface Fact {
  id: number
  content: string
  created_at: string
}

const SCHEMA = `
CREATE TABLE IF NOT EXISTS facts (
  id INTEGER PRIMARY KEY AUTOINCREMENT,
  content TEXT NOT NULL,
  created_at TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now'))
);
CREATE VIRTUAL TABLE IF NOT EXISTS facts_fts USING fts5(content, content='facts', content_rowid='id');
CREATE TRIGGER IF NOT EXISTS facts_ai AFTER INSERT ON facts BEGIN
  INSERT INTO facts_fts(rowid, content) VALUES (new.id, new.content);
END;
CREATE TRIGGER IF NOT EXISTS facts_ad AFTER DELETE ON facts BEGIN
  INSERT INTO facts_fts(facts_fts, rowid, content) VALUES ('delete', old.id, old.content);
END;
CREATE TABLE IF NOT EXISTS history (
  id INTEGER PRIMARY KEY AUTOINCREMENT,
  channel TEXT NOT NULL,
  message TEXT NOT NULL,
  created_at TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now'))
);
CREATE INDEX IF NOT EXISTS history_channel ON history(channel, id);
`

export class Memory {
  constructor(private readonly db: Database.Database) {}

  close(): void {
    this.db.close()
  }

  storeFact(content: string): Fact {
    const row = this.db
      .prepare('INSERT INTO facts(content) VALUES (?) RETURNING id, content, created_at')
      .get(content) as Fact
    return row
  }

  /** FTS5 search; the query is split into quoted terms so user text can never be FTS syntax. */
  searchFacts(query: string, limit = 5): Fact[] {
    const terms = query.match(/[\p{L}\p{N}_]+/gu) ?? []
    if (terms.length === 0) return []
    const match = terms.map((term) => `"${term}"`).join(' OR ')
    return this.db
      .prepare(
        `SELECT facts.id, facts.content, facts.created_at FROM facts_fts JOIN facts ON facts.id = facts_fts.rowid
         WHERE facts_fts MATCH ? ORDER BY bm25(facts_fts) LIMIT ?`,
      )
      .all(match, Math.max(1, Math.min(limit, 50))) as Fact[]
  }

  deleteFact(id: number): boolean {
    return this.db.prepare('DELETE FROM facts WHERE id = ?').run(id).changes > 0
  }

  countFacts(): number {
    return (this.db.prepare('SELECT count(*) AS n FROM facts').get() as {n: number}).n
  }

  /** The channel's history, oldest first, starting at a user turn so tool results are never orphaned. */
  history(channel: string): ChatMessage[] {
    const rows = this.db
      .prepare(
        'SELECT message FROM (SELECT id, message FROM history WHERE channel = ? ORDER BY id DESC LIMIT ?) ORDER BY id ASC',
      )
      .all(channel, HISTORY_LIMIT) as Array<{message: string}>
    const messages = rows.map((row) => JSON.parse(row.message) as ChatMessage)
    const firstUser = messages.findIndex((message) => message.role === 'user')
    return firstUser === -1 ? [] : messages.slice(firstUser)
  }

  /** Appends one turn's messages atomically and trims the channel to HISTORY_LIMIT. */
  appendHistory(channel: string, messages: ChatMessage[]): void {
    const insert = this.db.prepare('INSERT INTO history(channel, message) VALUES (?, ?)')
    const trim = this.db.prepare(
      'DELETE FROM history WHERE channel = ? AND id NOT IN (SELECT id FROM history WHERE channel = ? ORDER BY id DESC LIMIT ?)',
    )
    this.db.transaction(() => {
      for (const message of messages) insert.run(channel, JSON.stringify(message))
      trim.run(channel, channel, HISTORY_LIMIT)
    })()
  }
}

/**
 * WAL + busy timeout: a run killed mid-write leaves a database that opens with every committed row.
 * A damaged memory.db (quick_check fails, or it is not a database) would fail every message of the
 * agent: it is moved aside as `memory.db.corrupt-<time>` and an empty one started; `onRecovered`
 * tells the operator what was moved.
 */
export function openMemory(workspace: string, options: {onRecovered?: (message: string) => void} = {}): Memory {
  const file = path.join(workspace, 'memory.db')
  try {
    return new Memory(openChecked(file))
  } catch (error) {
    if (!isSqliteDamage(error)) throw cannotOpen(file, error)
    const aside = `${file}.corrupt-${new Date().toISOString().replace(/[:.]/g, '-')}`
    for (const suffix of ['', '-wal', '-shm']) {
      try {
        fs.renameSync(file + suffix, aside + suffix)
      } catch (renameError) {
        if ((renameError as NodeJS.ErrnoException).code !== 'ENOENT') throw cannotOpen(file, error)
      }
    }
    options.onRecovered?.(
      `the agent's memory ${file} was damaged (${(error as Error).message}); moved it to ${aside} (its facts and history are there) and started an empty one`,
    )
    try {
      return new Memory(openChecked(file))
    } catch (retryError) {
      throw cannotOpen(file, retryError)
    }
  }
}

function openChecked(file: string): Database.Database {
  const db = openSqlite(file)
  try {
    db.pragma('journal_mode = WAL')
    db.pragma('busy_timeout = 5000')
    db.pragma('synchronous = NORMAL')
    const problems = (db.pragma('quick_check') as Array<{quick_check: string}>).map((row) => row.quick_check)
    if (problems.join() !== 'ok')
      throw Object.assign(new Error(problems.slice(0, 3).join('; ')), {code: 'SQLITE_CORRUPT'})
    db.exec(SCHEMA)
    return db
  } catch (error) {
    db.close()
    throw error
  }
}

function cannotOpen(file: string, error: unknown): GatewayError {
  return new GatewayError('E_STATE', `cannot open the agent's memory ${file}: ${(error as Error).message}`, {
    cause: error,
    suggestions: [`check that ${path.dirname(file)} is writable and not full`],
  })
}
