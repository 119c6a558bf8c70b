import {execa} from 'execa'
import fs from 'node:fs'
import os from 'node:os'
import path from 'node:path'
import {afterEach, expect, it} from 'vitest'
import {MIGRATIONS} from '../../../src/runtime/state/gateway-db.js'
import {openSqlite} from '../../../src/runtime/util/sqlite.js'
import {ROOT} from '../../helpers/home.js'

/*
 * An upgrade's migration (an ALTER TABLE ... ADD COLUMN) run by processes that open the older
 * gateway.db at the same moment (a gateway and sends): the schema version is read again under the
 * write lock, or all but one fail with "duplicate column name" (found by an outside review).
 */

const dirs: string[] = []
afterEach(() => {
  for (const dir of dirs.splice(0)) fs.rmSync(dir, {recursive: true, force: true})
})

/** A gateway.db as the previous release left it: every migration but the last. */
function previousReleaseHome(): string {
  const home = fs.mkdtempSync(path.join(os.tmpdir(), 'meepa-migrate-race-'))
  dirs.push(home)
  const db = openSqlite(path.join(home, 'gateway.db'))
  db.pragma('journal_mode = WAL')
  for (const migration of MIGRATIONS.slice(0, -1)) db.exec(migration.sql)
  db.pragma(`user_version = ${MIGRATIONS.length - 1}`)
  db.close()
  return home
}

it(
  'processes opening a gateway.db of the previous release at the same time all open it (the upgrade migration runs once)',
  {timeout: 60_000},
  async () => {
    const module = path.join(ROOT, 'dist', 'runtime', 'state', 'gateway-db.js')
    const failures: string[] = []
    for (let attempt = 0; attempt < 5; attempt++) {
      const home = previousReleaseHome()
      const at = Date.now() + 400 // all three start their open at the same moment
      const script = `import {openGatewayDb} from ${JSON.stringify(module)}
      while (Date.now() < ${at}) {}
      try { openGatewayDb(${JSON.stringify(home)}).close(); console.log('ok') } catch (error) { console.log(error.message) }`
      const results = await Promise.all(
        [0, 1, 2].map(() => execa(process.execPath, ['--input-type=module', '-e', script], {reject: false})),
      )
      failures.push(...results.map((result) => result.stdout).filter((out) => out !== 'ok'))
    }
    expect(failures).toEqual([])
  },
)
