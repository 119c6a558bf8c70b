import Database from 'better-sqlite3'
import fs from 'node:fs'
import {createRequire} from 'node:module'
import path from 'node:path'

/**
 * Opens a SQLite file with better-sqlite3's addon loaded by its path: the package's own lookup
 * (the `bindings` package) reads a stack trace and probes a dozen paths at every start, and the
 * CLI bundles hold better-sqlite3's JavaScript, from where that lookup cannot find the addon.
 */
export function openSqlite(file: string, options: Database.Options = {}): Database.Database {
  addon ??= loadAddon()
  // the typings say string; better-sqlite3 takes the loaded addon object as well
  return new Database(file, {...options, nativeBinding: addon as unknown as string})
}

let addon: object | undefined

/** better-sqlite3's package directory: what an isolation image must carry of it (its addon). */
export function sqlitePackageDir(): string {
  return path.dirname(createRequire(import.meta.url).resolve('better-sqlite3/package.json'))
}

function loadAddon(): object {
  const packageDir = sqlitePackageDir()
  const file = ['Release', 'Debug']
    .map((build) => path.join(packageDir, 'build', build, 'better_sqlite3.node'))
    .find((candidate) => fs.existsSync(candidate))
  if (!file)
    throw new Error(`better-sqlite3's addon is not built in ${packageDir}/build: run \`npm rebuild better-sqlite3\``)
  const module = {exports: {}}
  process.dlopen(module, file)
  return module.exports
}
