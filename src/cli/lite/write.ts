import fs from 'node:fs'

/**
 * Writes to stdout or stderr with write(2) on the descriptor: the first console.log creates
 * Node's stream for it (≈ 4 ms of module loading, a tenth of a short command's whole run). Like
 * that stream it waits out a non-blocking pipe that is full, and a reader that went away
 * (`| head`) ends the output quietly.
 */
export function writeToFd(fd: 1 | 2, text: string): void {
  let data = Buffer.from(text)
  while (data.length > 0) {
    try {
      data = data.subarray(fs.writeSync(fd, data))
    } catch (error) {
      const code = (error as NodeJS.ErrnoException).code
      if (code === 'EPIPE') return
      if (code !== 'EAGAIN') throw error
      Atomics.wait(new Int32Array(new SharedArrayBuffer(4)), 0, 0, 1) // the reader is behind: 1 ms
    }
  }
}
