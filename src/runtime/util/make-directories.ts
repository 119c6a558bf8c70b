import fs from 'node:fs'
import path from 'node:path'

/**
 * `mkdir -p`, each missing directory made with `mode`. Not Node's recursive mkdirSync: it never
 * returns where mkdir fails with ENOENT under a parent that exists (procfs, sysfs), so a
 * MEEPAGATEWAY_HOME under /proc spun forever. Throws the error of the first one it cannot make.
 */
export function makeDirectories(dir: string, mode: number): void {
  const missing: string[] = []
  for (let at = path.resolve(dir); !fs.existsSync(at) && path.dirname(at) !== at; at = path.dirname(at)) missing.push(at)
  // there, but a file (or a symlink to one): mkdir's own EEXIST, as `mkdir -p` says
  if (missing.length === 0 && !fs.statSync(dir).isDirectory()) fs.mkdirSync(dir)
  for (const each of missing.reverse()) {
    try {
      fs.mkdirSync(each, {mode})
    } catch (error) {
      // made meanwhile by another process: fine; a file or a dangling symlink in the way: not
      if ((error as NodeJS.ErrnoException).code === 'EEXIST' && fs.statSync(each, {throwIfNoEntry: false})?.isDirectory()) continue
      throw error
    }
  }
}
