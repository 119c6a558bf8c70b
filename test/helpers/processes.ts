import fs from 'node:fs'
import {BIN} from './home.js'

/** Live (not zombie) processes whose command line holds `marker`: a test's own commands only. */
export function processesWith(marker: string): number[] {
  return fs
    .readdirSync('/proc')
    .filter((pid) => {
      if (!/^\d+$/.test(pid)) return false
      try {
        const stat = fs.readFileSync(`/proc/${pid}/stat`, 'utf8')
        if (stat.slice(stat.lastIndexOf(')') + 2).startsWith('Z')) return false
        return fs.readFileSync(`/proc/${pid}/cmdline`, 'utf8').includes(marker)
      } catch {
        return false
      }
    })
    .map(Number)
}

/** A number unlikely to appear in any other command line, to mark a test's commands. */
export function uniqueMarker(): string {
  return String(Math.floor(Math.random() * 900_000) + 100_000)
}

/** Live agent-run processes working in `workspace` (their cwd), this test's only. */
export function agentRunsIn(workspace: string): number[] {
  return processesWith('agent-run').filter((pid) => {
    try {
      // agent-run itself (node bin/run.js agent-run), not its keeper
      const argv = fs.readFileSync(`/proc/${pid}/cmdline`, 'utf8').split('\0').filter(Boolean)
      return (
        fs.readlinkSync(`/proc/${pid}/cwd`) === workspace &&
        argv.length === 3 &&
        argv[1] === BIN &&
        argv[2] === 'agent-run'
      )
    } catch {
      return false
    }
  })
}
