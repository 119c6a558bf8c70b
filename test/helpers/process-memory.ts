import fs from 'node:fs'

/**
 * Every process running `meepagateway agent-run` (node …/bin/run.js agent-run), at any level: host,
 * sandbox or container.
 */
export function agentRunPids(): number[] {
  return fs
    .readdirSync('/proc')
    .filter((entry) => /^\d+$/.test(entry))
    .map(Number)
    .filter((pid) => {
      try {
        const argv = fs.readFileSync(`/proc/${pid}/cmdline`, 'utf8').split('\0')
        return argv.some((arg) => arg.endsWith('bin/run.js')) && argv.includes('agent-run')
      } catch {
        return false
      }
    })
}

export interface Holdings {
  environ: boolean
  cmdline: boolean
  /** Found in a readable, writable mapping (heap, stacks, anonymous memory) of the live process. */
  memory: boolean
}

/** Where a live process holds `needle` (as Latin-1/UTF-8 bytes or as UTF-16, as V8 may store strings). Needs root. */
export function whereHeld(pid: number, needle: string): Holdings {
  const patterns = [Buffer.from(needle, 'utf8'), Buffer.from(needle, 'utf16le')]
  const holds = (data: Buffer) => patterns.some((pattern) => data.includes(pattern))
  return {
    environ: holds(fs.readFileSync(`/proc/${pid}/environ`)),
    cmdline: holds(fs.readFileSync(`/proc/${pid}/cmdline`)),
    memory: memoryHolds(pid, holds, patterns[1]!.length),
  }
}

function memoryHolds(pid: number, holds: (data: Buffer) => boolean, overlap: number): boolean {
  const maps = fs.readFileSync(`/proc/${pid}/maps`, 'utf8').split('\n').filter(Boolean)
  const fd = fs.openSync(`/proc/${pid}/mem`, 'r')
  const chunk = Buffer.alloc(4 * 1024 * 1024)
  try {
    for (const line of maps) {
      const [range, perms] = line.split(/\s+/)
      if (!perms?.startsWith('rw')) continue // file contents mapped read-only are not what the process was given
      const [start, end] = range!.split('-').map((hex) => BigInt(`0x${hex}`))
      for (let at = start!; at < end!; at += BigInt(chunk.length - overlap)) {
        const length = Number(end! - at < BigInt(chunk.length) ? end! - at : BigInt(chunk.length))
        let read: number
        try {
          read = fs.readSync(fd, chunk, 0, length, at)
        } catch {
          break // a guard page or a mapping that went away
        }
        if (read > 0 && holds(chunk.subarray(0, read))) return true
        if (read < length) break
      }
    }
  } finally {
    fs.closeSync(fd)
  }
  return false
}
