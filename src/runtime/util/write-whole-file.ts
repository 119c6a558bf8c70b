import fs from 'node:fs'
import path from 'node:path'

export interface WholeFileOptions {
  /** Permission bits of a new file; a file it replaces keeps its own. */
  mode?: number
  /** Test hook: runs after the temp file is written and synced, before it is put in place. */
  beforeRename?: (tempPath: string) => void
  /** Never replace a file: put in place with link(2), which fails with EEXIST when the name exists. */
  exclusive?: boolean
  /**
   * `mode` exactly, whatever the umask and whatever the name held (a file, or a link whose target's
   * mode would otherwise be copied): set on the temp file's descriptor.
   */
  exactMode?: boolean
  /**
   * false: whole for every reader, but not yet on the disk (neither it nor its folder fsynced); a
   * crash of the machine may take it back. The caller makes it durable later (writeWholeFileAside).
   */
  durable?: false
}

/**
 * Puts `content` at `file` so that a reader (or a crash) sees the file as it was or whole, never
 * a part: a temp file in the same directory, fsynced, renamed (or linked) into place, and the
 * directory fsynced so that step is durable too. Errors are the system's, as they came.
 */
export function writeWholeFile(file: string, content: string, options: WholeFileOptions = {}): void {
  const dir = path.dirname(file)
  let mode = options.mode ?? 0o600
  if (!options.exclusive && !options.exactMode) {
    try {
      mode = fs.statSync(file).mode & 0o7777
    } catch {
      // a new file gets options.mode
    }
  }
  const temp = wholeFileTemp(file)
  let renamed = false
  try {
    const fd = fs.openSync(temp, 'wx', mode)
    try {
      if (options.exactMode) fs.fchmodSync(fd, mode)
      fs.writeFileSync(fd, content)
      if (options.durable !== false) fs.fsyncSync(fd)
    } finally {
      fs.closeSync(fd)
    }
    options.beforeRename?.(temp)
    if (options.exclusive) linkExclusively(temp, file, content, mode)
    else {
      fs.renameSync(temp, file)
      renamed = true
    }
    if (options.durable !== false) syncDirectory(dir)
  } finally {
    if (!renamed) fs.rmSync(temp, {force: true})
  }
}

/** A temp name beside `file`, its own to this call. */
function wholeFileTemp(file: string): string {
  return path.join(
    path.dirname(file),
    `.${path.basename(file)}.${process.pid}.${Math.random().toString(36).slice(2)}.tmp`,
  )
}

/**
 * writeWholeFile (a file it replaces keeps its mode) with its writes and fsyncs on libuv's
 * threads: for a file written after a reply went, whose fsyncs must not hold the event loop.
 */
export async function writeWholeFileAside(file: string, content: string, options: {mode?: number} = {}): Promise<void> {
  const mode = await fs.promises.stat(file).then(
    (stat) => stat.mode & 0o7777,
    () => options.mode ?? 0o600,
  )
  const temp = wholeFileTemp(file)
  let renamed = false
  try {
    const handle = await fs.promises.open(temp, 'wx', mode)
    try {
      await handle.writeFile(content)
      await handle.sync()
    } finally {
      await handle.close()
    }
    await fs.promises.rename(temp, file)
    renamed = true
    const folder = await fs.promises.open(path.dirname(file), 'r')
    try {
      await folder.sync().catch((error: unknown) => {
        if (!folderSyncRefused(error)) throw error
      })
    } finally {
      await folder.close()
    }
  } finally {
    if (!renamed) await fs.promises.rm(temp, {force: true})
  }
}

/** Removes `file` (gone already is fine) so that a crash cannot bring it back: its folder is fsynced. */
export function removeWholeFile(file: string): void {
  fs.rmSync(file, {force: true})
  try {
    syncDirectory(path.dirname(file))
  } catch (error) {
    if ((error as NodeJS.ErrnoException).code !== 'ENOENT') throw error
  }
}

function linkExclusively(temp: string, file: string, content: string, mode: number): void {
  try {
    fs.linkSync(temp, file)
  } catch (error) {
    // a file system without hard links: an exclusive create, as whole as one write makes it
    if (!['EPERM', 'ENOTSUP', 'EOPNOTSUPP', 'ENOSYS'].includes((error as NodeJS.ErrnoException).code ?? '')) throw error
    fs.writeFileSync(file, content, {flag: 'wx', mode})
  }
}

/** Makes a rename, creation or removal in `dir` durable; a file system that refuses a folder's fsync is let be. */
function syncDirectory(dir: string): void {
  let fd: number | undefined
  try {
    fd = fs.openSync(dir, 'r')
    fs.fsyncSync(fd)
  } catch (error) {
    if (!folderSyncRefused(error)) throw error
  } finally {
    if (fd !== undefined) fs.closeSync(fd)
  }
}

/** Some file systems refuse fsync on a directory; the rename has happened either way. */
export function folderSyncRefused(error: unknown): boolean {
  return ['EINVAL', 'EISDIR', 'EPERM', 'EBADF'].includes((error as NodeJS.ErrnoException).code ?? '')
}
