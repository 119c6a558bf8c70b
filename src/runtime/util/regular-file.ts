import fs from 'node:fs'

/**
 * The bytes of `file` when it is a regular file, read through no symbolic link and never blocking
 * on a FIFO or a device swapped in; undefined when it is anything else, missing or unreadable.
 * With `maxBytes`, reads at most that many.
 */
export function readRegularFile(file: string, maxBytes?: number): Buffer | undefined {
  let fd: number
  try {
    fd = fs.openSync(file, fs.constants.O_RDONLY | fs.constants.O_NOFOLLOW | fs.constants.O_NONBLOCK)
  } catch {
    return undefined
  }
  try {
    const stat = fs.fstatSync(fd)
    if (!stat.isFile()) return undefined
    if (maxBytes === undefined) return fs.readFileSync(fd)
    const buffer = Buffer.alloc(Math.min(stat.size, maxBytes))
    let length = 0
    while (length < buffer.length) {
      const read = fs.readSync(fd, buffer, length, buffer.length - length, null)
      if (read === 0) break
      length += read
    }
    return buffer.subarray(0, length)
  } finally {
    fs.closeSync(fd)
  }
}
