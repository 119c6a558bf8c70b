import fs from 'node:fs'
import path from 'node:path'
import {CONTAINER_HOSTS} from '../../../sandbox/docker/run-args.js'
import {makeHomeDirectories} from '../../util/make-directories.js'
import {writeWholeFile} from '../../util/write-whole-file.js'

/**
 * The gateway home's file bound at a network-less container's /etc/hosts (run-args.ts), written
 * when missing or changed (checked at every run: ≈ 20 µs). Readable by every uid: the container's
 * user is not the gateway's.
 */
export function containerHostsFile(home: string): string {
  const file = path.join(home, 'cache', 'container-hosts')
  const stat = fs.lstatSync(file, {throwIfNoEntry: false})
  const current = stat?.isFile() ? fs.readFileSync(file, 'utf8') : undefined
  if (current !== CONTAINER_HOSTS || (stat!.mode & 0o777) !== 0o644) {
    makeHomeDirectories(path.dirname(file), home)
    writeWholeFile(file, CONTAINER_HOSTS, {mode: 0o644})
    fs.chmodSync(file, 0o644)
  }
  return file
}
