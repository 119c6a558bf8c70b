import fs from 'node:fs'
import path from 'node:path'
import {APP_ROOT} from './app-root.js'

/**
 * The installed code: the app's root and the build's marker file (rewritten by every build and
 * install). A gateway still running the code of before an upgrade declines a `send`
 * (connectors/local-send/), and what an earlier build remembered is worked out again.
 */
export function buildIdentity(): string {
  try {
    const marker = fs.statSync(path.join(APP_ROOT, 'dist', 'cli.sources.json'))
    return `${APP_ROOT}:${marker.ino}:${marker.size}:${Math.floor(marker.mtimeMs)}`
  } catch {
    return `${APP_ROOT}:unbuilt`
  }
}
