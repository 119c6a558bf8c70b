import Database from 'better-sqlite3'
import fs from 'node:fs'
import os from 'node:os'
import path from 'node:path'
import {afterEach, beforeEach, describe, expect, it} from 'vitest'
import {ApiKeys} from '../../../src/runtime/state/api-keys.js'
import {MIGRATIONS, openGatewayDb, readGatewayDb, type GatewayDb} from '../../../src/runtime/state/gateway-db.js'
import {listRuns, RunRecords} from '../../../src/runtime/state/run-records.js'

let home: string
let db: GatewayDb

beforeEach(() => {
  home = fs.mkdtempSync(path.join(os.tmpdir(), 'meepa-state-'))
  db = openGatewayDb(home)
})
afterEach(() => {
  db.close()
  fs.rmSync(home, {recursive: true, force: true})
})

const start = (id: string, agentId = 'a1') => ({
  id,
  agentId,
  connector: 'meepachat',
  channelId: 'general',
  isolation: 'unrestricted' as const,
})

describe('gateway.db', () => {
  it('uses WAL and a busy timeout, and is private to the operator', () => {
    expect(db.pragma('journal_mode', {simple: true})).toBe('wal')
    expect(db.pragma('busy_timeout', {simple: true})).toBe(5000)
    expect(fs.statSync(path.join(home, 'gateway.db')).mode & 0o077).toBe(0)
  })

  it('reopens an existing database without re-running migrations', () => {
    new RunRecords(db).start(start('r1'))
    db.close()
    db = openGatewayDb(home)
    expect(new RunRecords(db).get('r1')?.status).toBe('running')
  })
})

describe('gateway.db read-only (runs)', () => {
  it('reads what a running gateway committed while it holds a write transaction, and cannot write', () => {
    new RunRecords(db).start(start('r1'))
    db.exec('BEGIN IMMEDIATE')
    db.prepare(`UPDATE runs SET status = 'ok' WHERE id = 'r1'`).run()
    const started = Date.now()
    expect(listRuns({home}).map((run) => [run.id, run.status])).toEqual([['r1', 'running']])
    expect(Date.now() - started).toBeLessThan(1000) // not the busy timeout
    expect(() => readGatewayDb(home, (reader) => reader.prepare(`DELETE FROM runs`).run())).toThrow(/readonly/)
    db.exec('COMMIT')
    expect(listRuns({home}).map((run) => run.status)).toEqual(['ok'])
    expect(readGatewayDb(home, (reader) => reader.pragma('busy_timeout', {simple: true}))).toBe(5000)
  })

  it('creates a missing database and migrates an older one, as a read-write open does', () => {
    const fresh = fs.mkdtempSync(path.join(os.tmpdir(), 'meepa-state-'))
    try {
      expect(listRuns({home: fresh})).toEqual([])
      const old = new Database(path.join(fresh, 'gateway.db'))
      expect(old.pragma('user_version', {simple: true})).toBe(MIGRATIONS.length)
      old.pragma('user_version = 0')
      old.exec(
        'DROP TABLE runs; DROP TABLE api_keys; DROP TABLE captain_settings; DROP TABLE captain_sessions; DROP TABLE audit; DROP TABLE captain_login_links; DROP TABLE run_processes; DROP TABLE run_files',
      )
      old.exec(MIGRATIONS[0]!.sql)
      old.pragma('user_version = 1')
      old
        .prepare(
          `INSERT INTO runs (id, agent_id, connector, channel_id, isolation, status, started_at) VALUES ('r0', 'a', 'cli', 'c', 'unrestricted', 'ok', 1)`,
        )
        .run()
      old.close()
      expect(listRuns({home: fresh})).toEqual([expect.objectContaining({id: 'r0', restart_reply: null})])
      expect(readGatewayDb(fresh, (reader) => reader.pragma('user_version', {simple: true}))).toBe(MIGRATIONS.length)
    } finally {
      fs.rmSync(fresh, {recursive: true, force: true})
    }
  })

  it('reports a damaged database as a read-write open does', () => {
    const damaged = fs.mkdtempSync(path.join(os.tmpdir(), 'meepa-state-'))
    try {
      fs.writeFileSync(
        path.join(damaged, 'gateway.db'),
        'this is not a database, but it is long enough to have a header at all '.repeat(20),
      )
      expect(() => listRuns({home: damaged})).toThrow(/the gateway database .* is damaged/)
    } finally {
      fs.rmSync(damaged, {recursive: true, force: true})
    }
  })
})

describe('run records', () => {
  it('records a run from start to a successful end with usage', () => {
    const records = new RunRecords(db)
    records.start(start('r1'))
    records.finish(
      'r1',
      {
        version: 1,
        ok: true,
        run_id: 'r1',
        reply: {content: 'hi'},
        stop_reason: 'final',
        iterations: 2,
        tool_calls: [{name: 'shell', ok: true, ms: 3}],
        usage: {input_tokens: 11, output_tokens: 7},
        ms: 40,
      },
      {durationMs: 42},
    )
    expect(records.get('r1')).toMatchObject({
      status: 'ok',
      duration_ms: 42,
      input_tokens: 11,
      output_tokens: 7,
      iterations: 2,
      tool_calls: 1,
      error_code: null,
    })
  })

  it('records a failed run with its error code and message', () => {
    const records = new RunRecords(db)
    records.start(start('r1'))
    records.finish(
      'r1',
      {version: 1, ok: false, run_id: 'r1', error: {code: 'E_TIMEOUT', message: 'took too long', retryable: false}},
      {durationMs: 5},
    )
    expect(records.get('r1')).toMatchObject({status: 'failed', error_code: 'E_TIMEOUT', error_message: 'took too long'})
  })

  it('marks runs a dead gateway left running as interrupted, and only those', () => {
    const records = new RunRecords(db)
    records.start(start('r1'))
    records.start(start('r2'))
    records.finish(
      'r2',
      {version: 1, ok: false, run_id: 'r2', error: {code: 'E_PROVIDER', message: 'down', retryable: true}},
      {durationMs: 5},
    )
    expect(records.markStaleInterrupted()).toBe(1)
    expect(records.get('r1')).toMatchObject({status: 'interrupted', error_code: 'E_RUN'})
    expect(records.get('r2')?.status).toBe('failed')
  })

  it('lists newest first, filtered by agent and limited', () => {
    const records = new RunRecords(db)
    for (let i = 0; i < 5; i++) records.start({...start(`r${i}`, i % 2 ? 'b' : 'a'), startedAt: 1000 + i})
    expect(records.list({limit: 3}).map((run) => run.id)).toEqual(['r4', 'r3', 'r2'])
    expect(records.list({agentId: 'b'}).map((run) => run.id)).toEqual(['r3', 'r1'])
  })
})

describe('API keys', () => {
  it('creates a cptn_ key, verifies it, and stores only its hash', () => {
    const keys = new ApiKeys(db)
    const created = keys.create('deploy')
    expect(created.key).toMatch(/^cptn_[A-Za-z0-9_-]{40,}$/)
    expect(keys.verify(created.key)?.id).toBe(created.id)
    db.close()
    const raw = fs.readFileSync(path.join(home, 'gateway.db'))
    const wal = fs.existsSync(path.join(home, 'gateway.db-wal'))
      ? fs.readFileSync(path.join(home, 'gateway.db-wal'))
      : Buffer.alloc(0)
    expect(raw.includes(created.key)).toBe(false)
    expect(wal.includes(created.key)).toBe(false)
    const check = new Database(path.join(home, 'gateway.db'), {readonly: true})
    const row = check.prepare('SELECT * FROM api_keys').get() as Record<string, unknown>
    check.close()
    expect(Object.values(row)).not.toContain(created.key)
    db = openGatewayDb(home)
  })

  it('refuses unknown, mangled and revoked keys', () => {
    const keys = new ApiKeys(db)
    const created = keys.create('ci')
    expect(keys.verify('cptn_nope')).toBeUndefined()
    expect(keys.verify(created.key.slice(0, -1))).toBeUndefined()
    expect(keys.verify(created.key.replace('cptn_', 'xxxx_'))).toBeUndefined()
    keys.revoke(created.id)
    expect(keys.verify(created.key)).toBeUndefined()
    expect(keys.list()[0]?.revoked_at).toBeTypeOf('number')
  })

  it('names the problem for an unknown id or an empty name', () => {
    const keys = new ApiKeys(db)
    expect(() => keys.revoke('key_missing')).toThrow(/no API key with id key_missing/)
    expect(() => keys.create('  ')).toThrow(/1 to 100 characters/)
  })
})
