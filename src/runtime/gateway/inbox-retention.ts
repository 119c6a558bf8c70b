import fs from 'node:fs'
import path from 'node:path'
import {removeTrees} from '../../sandbox/directory-tree.js'
import type {LoadedConfig} from '../config/types.js'
import {workspacePath} from '../workspace/location.js'

const {O_RDONLY, O_DIRECTORY, O_NOFOLLOW} = fs.constants
const DAY_MS = 24 * 60 * 60_000
/** How often serve looks for inbox folders past their agent's retention. */
export const INBOX_SWEEP_INTERVAL_MS = 60 * 60_000

/**
 * Removes the `inbox/<message id>/` folders of a workspace last changed more than `maxAgeMs` ago
 * (attachments.inbox_retention_days), so received files do not pile up for ever. The workspace is
 * the agent's: `inbox` is opened without following a link (a link there is left alone), only real
 * folders in it are candidates (a planted link is not one), and each is removed through the
 * descriptor the gateway opened (`/proc/<pid>/fd/N/<name>`), by the helper's descriptor-relative
 * walk, which never follows a link inside either, even one swapped in meanwhile. Returns how many
 * folders went; throws naming what could not be removed.
 */
export async function pruneInbox(workspace: string, maxAgeMs: number, now = Date.now()): Promise<number> {
  let inbox: number
  try {
    inbox = fs.openSync(path.join(fs.realpathSync(workspace), 'inbox'), O_RDONLY | O_DIRECTORY | O_NOFOLLOW)
  } catch (error) {
    const code = (error as NodeJS.ErrnoException).code
    if (code === 'ENOENT') return 0 // no workspace or no inbox yet
    if (code === 'ELOOP' || code === 'ENOTDIR')
      throw new Error('its inbox is not a folder (a link?); left alone', {cause: error})
    throw error
  }
  try {
    // where /proc is missing (macOS) the path, checked just now, is the best there is
    const opened = fs.existsSync(`/proc/self/fd/${inbox}`)
      ? `/proc/${process.pid}/fd/${inbox}`
      : path.join(fs.realpathSync(workspace), 'inbox')
    const old = fs.readdirSync(opened).filter((name) => {
      const stat = fs.lstatSync(path.join(opened, name), {throwIfNoEntry: false})
      return stat?.isDirectory() && now - stat.mtimeMs > maxAgeMs
    })
    await removeTrees(old.map((name) => path.join(opened, name)))
    return old.length
  } finally {
    fs.closeSync(inbox)
  }
}

/** pruneInbox for every agent of the config, each with its own retention; one line per agent that had any. */
export async function pruneInboxes(loaded: LoadedConfig, log: (line: string) => void): Promise<void> {
  for (const agent of loaded.config.agents) {
    const days = agent.attachments.inbox_retention_days
    try {
      const removed = await pruneInbox(workspacePath(loaded.home, agent.id), days * DAY_MS)
      if (removed > 0) log(`gateway: agent ${agent.id}: removed ${removed} inbox folder(s) older than ${days} day(s)`)
    } catch (error) {
      log(`gateway: agent ${agent.id}: could not clean its inbox: ${(error as Error).message}`)
    }
  }
}
