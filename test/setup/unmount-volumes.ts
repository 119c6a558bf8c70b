import fs from 'node:fs'
import os from 'node:os'
import {unmountBelow} from '../helpers/home.js'

/*
 * A root gateway mounts each workspace it runs as a volume of its own (src/runtime/workspace/volume.ts),
 * and the mount outlives the CLI. Tests remove their scratch homes with fs.rmSync, which cannot
 * remove a mount point (EBUSY): every recursive removal of a directory below the temp dir first
 * unmounts what is mounted below it, so no test leaves a mount or a loop device behind.
 */
const tmp = fs.realpathSync(os.tmpdir())
const rmSync = fs.rmSync
fs.rmSync = (target, options) => {
  if (options?.recursive && typeof target === 'string' && target.startsWith(`${tmp}/`)) unmountBelow(target)
  rmSync(target, options)
}
