import {spawnSync} from 'node:child_process'
import fs from 'node:fs'
import {GatewayError} from '../util/errors.js'

export interface Owner {
  uid: number
  gid: number
}

/**
 * Before a host-sandbox run or command: a container run left the workspace to its uid, and the
 * sandbox's root has no capability to write there, so a root gateway takes it back.
 */
export function reclaimWorkspace(workspace: string): void {
  handWorkspaceTo(workspace, {uid: process.getuid?.() ?? 0, gid: process.getgid?.() ?? 0}, {onlyIfRootDiffers: true, purpose: 'the host sandbox'})
}

/**
 * A root gateway hands the whole workspace to `owner`: a container run as an unprivileged uid, or
 * back to the gateway itself for a host-sandbox run, whose root has no CAP_DAC_OVERRIDE/CAP_FOWNER
 * and so cannot write files another uid owns. GNU chown -R -P walks with openat and never follows a
 * symlink the agent planted; the kernel drops setuid/setgid bits of every file it re-owns.
 * With `onlyIfRootDiffers` the walk is skipped when the workspace root already has that owner:
 * chown -R changes a directory after its contents, so a root with the owner means the last
 * hand-over finished.
 */
export function handWorkspaceTo(workspace: string, owner: Owner, options: {onlyIfRootDiffers?: boolean; purpose: string}): void {
  if (process.getuid?.() !== 0) return
  workspace = fs.realpathSync(workspace)
  if (options.onlyIfRootDiffers) {
    const root = fs.lstatSync(workspace)
    if (root.uid === owner.uid && root.gid === owner.gid) return
  }
  const result = spawnSync('chown', ['-R', '-P', '-h', `${owner.uid}:${owner.gid}`, '--', workspace], {encoding: 'utf8', timeout: 60_000})
  if (result.status !== 0) {
    throw new GatewayError('E_WORKSPACE', `cannot hand the workspace ${workspace} to uid ${owner.uid} for ${options.purpose}: ${(result.stderr || result.error?.message || '').trim()}`, {
      suggestions: ['check that `chown` (coreutils) is installed', `or chown -R ${owner.uid}:${owner.gid} ${workspace} by hand`],
    })
  }
}
