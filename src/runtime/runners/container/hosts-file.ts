import fs from 'node:fs'
import path from 'node:path'
import {CONTAINER_HOSTS} from '../../../sandbox/docker/run-args.js'
import {randomHex} from '../../util/random.js'
import {homeUnusable, makeHomeDirectories} from '../../util/make-directories.js'

/**
 * The gateway home's file bound at a network-less container's /etc/hosts (run-args.ts), checked
 * at every run (≈ 20 µs) and put back when it is not exactly that: missing, changed, a link, or
 * not readable by every uid (the container's user is not the gateway's). Written beside, made
 * 0644 by its descriptor (no umask, no link followed) and renamed over the name.
 */
export function containerHostsFile(home: string): string {
  const file = path.join(home, 'cache', 'container-hosts')
  const stat = fs.lstatSync(file, {throwIfNoEntry: false})
  if (stat?.isFile() && (stat.mode & 0o777) === 0o644 && fs.readFileSync(file, 'utf8') === CONTAINER_HOSTS) return file
  makeHomeDirectories(path.dirname(file), home)
  const temp = `${file}.${process.pid}.${randomHex(4)}.tmp`
  try {
    const fd = fs.openSync(temp, 'wx', 0o600)
    try {
      fs.fchmodSync(fd, 0o644)
      fs.writeFileSync(fd, CONTAINER_HOSTS)
      fs.fsyncSync(fd)
    } finally {
      fs.closeSync(fd)
    }
    fs.renameSync(temp, file)
  } catch (error) {
    fs.rmSync(temp, {force: true})
    throw homeUnusable(home, error)
  }
  return file
}
