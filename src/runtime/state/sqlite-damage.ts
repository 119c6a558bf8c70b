/**
 * Whether a better-sqlite3 error says the file's pages are not a valid database (not a passing lock
 * or I/O problem).
 */
export function isSqliteDamage(error: unknown): boolean {
  const code = (error as {code?: unknown} | undefined)?.code
  return typeof code === 'string' && (code === 'SQLITE_NOTADB' || code.startsWith('SQLITE_CORRUPT'))
}
