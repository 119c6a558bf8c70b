import fs from 'node:fs'
import path from 'node:path'
import {GatewayError} from './errors.js'

/**
 * `mkdir -p`, each missing directory made with `mode`. Not Node's recursive mkdirSync: it never
 * returns where mkdir fails with ENOENT under a parent that exists (procfs, sysfs), so a
 * MEEPAGATEWAY_HOME under /proc spun forever. Throws the error of the first one it cannot make.
 */
export function makeDirectories(dir: string, mode: number): void {
  const missing: string[] = []
  // only what does not exist is made (a directory that cannot be searched is its own error, named as it is)
  for (
    let at = path.resolve(dir);
    !fs.statSync(at, {throwIfNoEntry: false}) && path.dirname(at) !== at;
    at = path.dirname(at)
  )
    missing.push(at)
  // there, but a file (or a symlink to one): mkdir's own EEXIST, as `mkdir -p` says
  if (missing.length === 0 && !fs.statSync(dir).isDirectory()) fs.mkdirSync(dir)
  for (const each of missing.reverse()) {
    try {
      fs.mkdirSync(each, {mode})
    } catch (error) {
      // made meanwhile by another process: fine; a file or a dangling symlink in the way: not
      if (
        (error as NodeJS.ErrnoException).code === 'EEXIST' &&
        fs.statSync(each, {throwIfNoEntry: false})?.isDirectory()
      )
        continue
      throw error
    }
  }
}

/**
 * makeDirectories for a directory of the gateway home, or the home itself; failing, the error
 * every command gives for a home it cannot use (E_STATE, exit 5).
 */
export function makeHomeDirectories(dir: string, home: string): void {
  try {
    makeDirectories(dir, 0o700)
  } catch (error) {
    throw homeUnusable(home, error)
  }
}

export function homeUnusable(home: string, error: unknown): GatewayError {
  return new GatewayError('E_STATE', `the gateway home ${home} cannot be used: ${(error as Error).message}`, {
    suggestions: ['set MEEPAGATEWAY_HOME to a directory you can write (default ~/.meepagateway)'],
  })
}
