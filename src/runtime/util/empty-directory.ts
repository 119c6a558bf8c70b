import fs from 'node:fs'

/**
 * Whether `dir` is a directory with no entry (false for anything else, or an error). Reads one
 * entry, never the whole listing: a run's directory can hold millions, and this runs on the
 * gateway's event loop.
 */
export function isEmptyDirectory(dir: string): boolean {
  try {
    const listing = fs.opendirSync(dir)
    try {
      return listing.readSync() === null
    } finally {
      listing.closeSync()
    }
  } catch {
    return false
  }
}
