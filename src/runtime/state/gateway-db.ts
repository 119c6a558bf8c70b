import type Database from 'better-sqlite3'
import fs from 'node:fs'
import {GatewayError} from '../util/errors.js'
import {isSqliteDamage} from './sqlite-damage.js'
import {gatewayDbPath} from '../util/paths.js'
import {openSqlite} from '../util/sqlite.js'
import {makeDirectories} from '../util/make-directories.js'

export type GatewayDb = Database.Database

/**
 * Schema changes, applied in order and tracked with `PRAGMA user_version`. Append, never edit:
 * a database already at version N only runs the migrations after N. Other parts of the gateway
 * (the dashboard's `sessions` table) add their tables by appending here.
 */
export const MIGRATIONS: ReadonlyArray<{name: string; sql: string}> = [
  {
    name: 'runs and api keys',
    sql: `
      CREATE TABLE runs (
        id TEXT PRIMARY KEY,
        agent_id TEXT NOT NULL,
        connector TEXT NOT NULL,
        channel_id TEXT NOT NULL,
        thread_id TEXT,
        message_id TEXT,
        user_id TEXT,
        isolation TEXT NOT NULL,
        status TEXT NOT NULL,            -- running | ok | failed | interrupted | rejected
        started_at INTEGER NOT NULL,     -- ms since epoch
        duration_ms INTEGER,
        error_code TEXT,
        error_message TEXT,
        input_tokens INTEGER,
        output_tokens INTEGER,
        iterations INTEGER,
        tool_calls INTEGER
      );
      CREATE INDEX runs_by_start ON runs (started_at DESC);
      CREATE INDEX runs_by_agent ON runs (agent_id, started_at DESC);
      CREATE INDEX runs_by_status ON runs (status);

      CREATE TABLE api_keys (
        id TEXT PRIMARY KEY,
        name TEXT NOT NULL,
        key_hash TEXT NOT NULL UNIQUE,   -- sha256 hex of the whole key; the key itself is never stored
        key_prefix TEXT NOT NULL,        -- first characters, so an operator can tell keys apart
        created_at INTEGER NOT NULL,
        last_used_at INTEGER,
        revoked_at INTEGER
      );
    `,
  },
  {
    name: 'dashboard settings and sessions',
    sql: `
      CREATE TABLE captain_settings (
        key TEXT PRIMARY KEY,            -- password_hash
        value TEXT NOT NULL,
        updated_at INTEGER NOT NULL
      );
      CREATE TABLE captain_sessions (
        token_hash TEXT PRIMARY KEY,     -- sha256 hex of the cookie value; the cookie itself is never stored
        csrf_token TEXT NOT NULL,
        created_at INTEGER NOT NULL,
        expires_at INTEGER NOT NULL,
        last_seen_at INTEGER NOT NULL
      );
      CREATE INDEX captain_sessions_by_expiry ON captain_sessions (expires_at);
    `,
  },
  {
    // Keys made before there were two kinds become chat keys; serve says so once (the notice row).
    name: 'api key kinds, audit log and one-time dashboard links',
    sql: `
      ALTER TABLE api_keys ADD COLUMN kind TEXT NOT NULL DEFAULT 'chat';  -- chat | admin
      INSERT INTO captain_settings (key, value, updated_at)
        SELECT 'legacy_keys_notice', CAST(count(*) AS TEXT), CAST(strftime('%s', 'now') AS INTEGER) * 1000 FROM api_keys WHERE revoked_at IS NULL HAVING count(*) > 0;
      CREATE TABLE audit (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        at INTEGER NOT NULL,             -- ms since epoch
        level TEXT NOT NULL,             -- info | warning
        event TEXT NOT NULL,             -- login_failed, config_change, api_key_created, ...
        principal TEXT NOT NULL,         -- dashboard session, key_… (name), anonymous, cli
        source TEXT,                     -- remote address of the request
        summary TEXT NOT NULL,
        details TEXT                     -- JSON
      );
      CREATE INDEX audit_by_time ON audit (at);
      DELETE FROM captain_sessions;    -- cookie sessions end: the dashboard now proves itself with a bearer token
      CREATE TABLE captain_login_links (
        token_hash TEXT PRIMARY KEY,     -- sha256 hex of the one-time secret in the URL fragment
        created_at INTEGER NOT NULL,
        expires_at INTEGER NOT NULL
      );
    `,
  },
  {
    // issue 14: a run a crashed gateway left is answered on its connector at the next start-up
    name: 'restart replies for interrupted runs',
    sql: `
      ALTER TABLE runs ADD COLUMN restart_reply TEXT;   -- NULL | pending | sent <ISO time> | failed: <reason>
      CREATE INDEX runs_by_restart_reply ON runs (restart_reply) WHERE restart_reply IS NOT NULL;
    `,
  },
  {
    name: 'run processes (what a crashed owner left to kill)',
    sql: `
      CREATE TABLE run_processes (
        run_id TEXT PRIMARY KEY,
        owner_pid INTEGER NOT NULL,      -- the serve or send process that started the run
        owner_start TEXT,                -- its start time (/proc/PID/stat), so a reused pid is not taken for it
        keeper_pid INTEGER,              -- meepa-sandbox --keeper-fd, which kills the run when the owner dies
        cgroups TEXT NOT NULL,           -- JSON array of the run's cgroup directories
        container TEXT,                  -- container name (container level)
        tmp_dir TEXT,                    -- the run's private TMPDIR
        started_at INTEGER NOT NULL
      );
    `,
  },
  {
    // a keeper pid alone can be another process by now (pid reuse, a pid namespace per send): even
    // this start-up's own keeper
    name: 'the keeper start time of run processes',
    sql: `
      ALTER TABLE run_processes ADD COLUMN keeper_start TEXT;  -- the keeper's start time (/proc/PID/stat)
    `,
  },
  {
    // what came in or went out with a run: names and sizes only, never the content
    name: 'the files of runs',
    sql: `
      CREATE TABLE run_files (
        run_id TEXT NOT NULL,
        direction TEXT NOT NULL CHECK (direction IN ('in', 'out')),
        name TEXT NOT NULL,
        size INTEGER,                    -- bytes; NULL when a refused file was never read
        content_type TEXT,
        skipped_reason TEXT              -- NULL: delivered; otherwise why it was not
      );
      CREATE INDEX run_files_by_run ON run_files (run_id);
    `,
  },
  {
    // issue 28: a message a platform delivers again (Slack's redelivery, Discord's replay on resume)
    // after a reconnect or a restart is answered once
    name: 'inbound messages handled, per connector and channel',
    sql: `
      CREATE TABLE inbound_handled (
        connector TEXT NOT NULL,         -- the connector's name (agent/type, #n for a second one)
        channel_id TEXT NOT NULL,
        message_id TEXT NOT NULL,
        posted_at INTEGER NOT NULL,      -- ms since epoch, as the platform dates the message
        handled_at INTEGER NOT NULL,
        PRIMARY KEY (connector, channel_id, message_id)
      ) WITHOUT ROWID;
      CREATE INDEX inbound_handled_by_time ON inbound_handled (posted_at);
    `,
  },
  {
    // issue 28: a chat reply is written here before its first send and leaves once delivered or given up on
    name: 'reply outbox and delivery state of runs',
    sql: `
      ALTER TABLE runs ADD COLUMN delivery TEXT;        -- NULL (answered in the request: web chat, send) | pending | delivered | undeliverable
      ALTER TABLE runs ADD COLUMN delivery_error TEXT;  -- why an undeliverable reply could not go out
      ALTER TABLE runs ADD COLUMN delivered_at INTEGER; -- ms since epoch: when the reply went out or was given up on
      CREATE INDEX runs_by_delivery ON runs (delivery, delivered_at) WHERE delivery IS NOT NULL;
      CREATE TABLE outbox (
        id INTEGER PRIMARY KEY AUTOINCREMENT,  -- replies to one conversation go out in this order
        run_id TEXT NOT NULL,
        connector TEXT NOT NULL,         -- the connector's name (agent/type, #n for a second one)
        channel_id TEXT NOT NULL,
        thread_id TEXT,
        created_at INTEGER NOT NULL,     -- ms since epoch; retries end gateway.reply_delivery_minutes after it
        attempts INTEGER NOT NULL DEFAULT 0,
        last_error TEXT
      );
      CREATE INDEX outbox_by_conversation ON outbox (connector, channel_id, thread_id, id);
      CREATE TABLE outbox_parts (
        reply_id INTEGER NOT NULL REFERENCES outbox (id) ON DELETE CASCADE,
        seq INTEGER NOT NULL,            -- delivered strictly in this order
        kind TEXT NOT NULL,              -- text (one chunk of the reply); outbound files add their kind
        content TEXT NOT NULL,           -- the chunk's text
        sent_at INTEGER,                 -- ms since epoch, once the platform took it
        PRIMARY KEY (reply_id, seq)
      );
    `,
  },
  {
    // issue 28/23: a file sent with a reply is a part of its own, its bytes in the gateway's spool
    name: 'file parts of outbox replies',
    sql: `
      ALTER TABLE outbox_parts ADD COLUMN file_size INTEGER;  -- a file part: its bytes (its name is in content)
      ALTER TABLE outbox_parts ADD COLUMN content_type TEXT;  -- a file part: its type
      ALTER TABLE outbox_parts ADD COLUMN spool TEXT;         -- a file part not yet delivered: its copy in <home>/spool/outbox
      ALTER TABLE outbox_parts ADD COLUMN refused TEXT;       -- a file part the platform refused for good: why (sent_at set too)
    `,
  },
  {
    // issue 24: a crashed gateway's container on a remote engine is removed there at the next start-up
    name: 'the engine of run processes',
    sql: `
      ALTER TABLE run_processes ADD COLUMN engine TEXT;  -- JSON {name, args, sync_state}: a listed engine's docker flags
    `,
  },
]

/**
 * Opens (creating if needed) $MEEPAGATEWAY_HOME/gateway.db. WAL lets `runs` and `api-key`
 * commands read and write while `serve` holds the database open; busy_timeout makes a
 * concurrent writer wait instead of failing with SQLITE_BUSY.
 */
export function openGatewayDb(home: string, options: {check?: boolean} = {}): GatewayDb {
  const file = gatewayDbPath(home)
  let db: GatewayDb
  try {
    makeDirectories(home, 0o700)
    db = openSqlite(file)
    db.pragma('journal_mode = WAL')
    db.pragma('busy_timeout = 5000')
    db.pragma('synchronous = NORMAL')
    db.pragma('foreign_keys = ON')
  } catch (error) {
    if (isSqliteDamage(error)) throw damagedDatabase(file, (error as Error).message)
    throw new GatewayError('E_STATE', `cannot open the gateway database ${file}: ${(error as Error).message}`, {
      cause: error,
      suggestions: [`check that ${home} is writable by this user`, 'set MEEPAGATEWAY_HOME to another directory'],
    })
  }
  try {
    fs.chmodSync(file, 0o600) // API key hashes and run metadata are the operator's business only
    if (options.check) {
      const problems = (db.pragma('quick_check') as Array<{quick_check: string}>).map((row) => row.quick_check)
      if (problems.join() !== 'ok') throw damagedDatabase(file, problems.slice(0, 3).join('; '))
    }
    migrate(db)
  } catch (error) {
    db.close()
    if (error instanceof GatewayError) throw error
    if (isSqliteDamage(error)) throw damagedDatabase(file, (error as Error).message)
    throw new GatewayError('E_STATE', `cannot prepare the gateway database ${file}: ${(error as Error).message}`, {
      cause: error,
    })
  }
  return db
}

function damagedDatabase(file: string, problem: string): GatewayError {
  return new GatewayError('E_STATE', `the gateway database ${file} is damaged: ${problem}`, {
    suggestions: [
      `recover what is readable: sqlite3 ${file} .recover | sqlite3 ${file}.recovered && mv ${file} ${file}.damaged && mv ${file}.recovered ${file}`,
      `or move it aside to start empty (run records, API keys and the dashboard password are then lost): mv ${file} ${file}.damaged`,
    ],
  })
}

function migrate(db: GatewayDb): void {
  const schemaVersion = () => {
    const current = db.pragma('user_version', {simple: true}) as number
    if (current > MIGRATIONS.length) {
      throw new GatewayError(
        'E_STATE',
        `the gateway database is at schema version ${current}, newer than this meepagateway understands (${MIGRATIONS.length})`,
        {suggestions: ['upgrade meepagateway, or point MEEPAGATEWAY_HOME at another directory']},
      )
    }
    return current
  }
  if (schemaVersion() === MIGRATIONS.length) return
  // Processes that open an older database at once (a gateway and sends after an upgrade): the
  // version is read again under the write lock, so only the first applies what is missing.
  db.transaction(() => {
    for (let version = schemaVersion(); version < MIGRATIONS.length; version++) {
      db.exec(MIGRATIONS[version].sql)
      db.pragma(`user_version = ${version + 1}`)
    }
  }).immediate()
}

/** Runs `fn` with the gateway database open, closing it afterwards (for one-shot commands). */
export function withGatewayDb<T>(home: string, fn: (db: GatewayDb) => T): T {
  const db = openGatewayDb(home)
  try {
    return fn(db)
  } finally {
    db.close()
  }
}

/**
 * Runs `fn` on a read-only connection (listings such as `runs`): no WAL switch, migration or
 * checkpoint at close, nothing a running gateway could wait on. A database that is missing, at
 * another schema version or fails to open goes through withGatewayDb, which creates, migrates or
 * reports it as before.
 */
export function readGatewayDb<T>(home: string, fn: (db: GatewayDb) => T): T {
  const file = gatewayDbPath(home)
  let db: GatewayDb | undefined
  try {
    // the busy timeout set at open, as busy_timeout = 5000 (one statement less)
    db = openSqlite(file, {readonly: true, fileMustExist: true, timeout: 5000})
    fs.chmodSync(file, 0o600) // as every open does: API key hashes and run metadata are the operator's business only
    if (db.pragma('user_version', {simple: true}) !== MIGRATIONS.length) throw new Error('not at this schema version')
  } catch {
    db?.close()
    return withGatewayDb(home, fn)
  }
  try {
    return fn(db)
  } finally {
    db.close()
  }
}

const sharedConnections = new Map<string, GatewayDb>()

/**
 * The process's one connection per home for frequent small writes (run ownership records). A
 * running gateway registers its guarded connection, so those writes follow the database when it is
 * repaired or replaced instead of keeping a second handle on the old file.
 */
export function sharedGatewayDb(home: string): GatewayDb {
  let db = sharedConnections.get(home)
  if (!db) {
    db = openGatewayDb(home)
    sharedConnections.set(home, db)
  }
  return db
}

/** A running gateway's connection becomes the shared one for its home (undefined: unregister). */
export function shareGatewayDb(home: string, db: GatewayDb | undefined): void {
  const previous = sharedConnections.get(home)
  if (db) sharedConnections.set(home, db)
  else sharedConnections.delete(home)
  if (previous && previous !== db && previous.open) previous.close()
}
