import fs from 'node:fs'
import path from 'node:path'
import {CONTAINER_HOSTS} from '../../../sandbox/docker/run-args.js'
import {homeUnusable, makeHomeDirectories} from '../../util/make-directories.js'
import {writeWholeFile} from '../../util/write-whole-file.js'

/**
 * The gateway home's file bound at a network-less container's /etc/hosts (run-args.ts), checked
 * at every run (≈ 20 µs) and put back when it is not exactly that: missing, changed, a link, or
 * not readable by every uid (the container's user is not the gateway's): written whole, 0644
 * exactly (no umask, no link's mode copied).
 */
export function containerHostsFile(home: string): string {
  const file = path.join(home, 'cache', 'container-hosts')
  const stat = fs.lstatSync(file, {throwIfNoEntry: false})
  if (stat?.isFile() && (stat.mode & 0o777) === 0o644 && fs.readFileSync(file, 'utf8') === CONTAINER_HOSTS) return file
  makeHomeDirectories(path.dirname(file), home)
  try {
    writeWholeFile(file, CONTAINER_HOSTS, {mode: 0o644, exactMode: true})
  } catch (error) {
    throw homeUnusable(home, error)
  }
  return file
}
