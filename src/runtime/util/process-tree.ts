import fs from 'node:fs'

/**
 * Inside the host sandbox nothing can call setsid() (seccomp), so every process a run starts stays
 * in the session its helper opened -- even one that moved to a process group of its own with
 * setpgid(). Killing that session's members by scanning /proc therefore reaches the whole tree.
 * Repeats until a scan finds nobody, so processes forked during a scan die in the next one.
 * Linux only; elsewhere a no-op.
 */
export function killSession(sessionId: number, maxRounds = 20): number {
  if (process.platform !== 'linux' || !Number.isInteger(sessionId) || sessionId <= 1) return 0
  let killed = 0
  for (let round = 0; round < maxRounds; round++) {
    const members = sessionMembers(sessionId)
    if (members.length === 0) break
    for (const pid of members) {
      try {
        process.kill(pid, 'SIGKILL')
        killed++
      } catch {
        // exited meanwhile
      }
    }
  }
  return killed
}

export function sessionMembers(sessionId: number): number[] {
  const members: number[] = []
  let entries: string[]
  try {
    entries = fs.readdirSync('/proc')
  } catch {
    return members
  }
  for (const entry of entries) {
    if (!/^\d+$/.test(entry)) continue
    const pid = Number(entry)
    if (pid === process.pid) continue
    try {
      const stat = fs.readFileSync(`/proc/${entry}/stat`, 'utf8')
      // the command name may hold spaces and parentheses: the fields start after the last ')'
      const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ')
      // state ppid pgrp session ...; zombies are already dead
      if (Number(fields[3]) === sessionId && fields[0] !== 'Z') members.push(pid)
    } catch {
      // exited meanwhile
    }
  }
  return members
}

/** The session id of a process (field 6 of /proc/PID/stat), or undefined off Linux or when it is gone. */
export function sessionOf(pid: number): number | undefined {
  try {
    const stat = fs.readFileSync(`/proc/${pid}/stat`, 'utf8')
    return Number(stat.slice(stat.lastIndexOf(')') + 2).split(' ')[3])
  } catch {
    return undefined
  }
}

/**
 * Kills what a child started as a process-group (and, when `detached`, session) leader: its group,
 * then every member of its session, which also reaches processes that moved to a group of their own.
 */
export function killProcessTree(pid: number | undefined): void {
  if (pid === undefined) return
  killProcessGroup(pid)
  killSession(pid)
}

/** SIGKILL to the process group `pid` leads; nothing when it is gone. */
export function killProcessGroup(pid: number | undefined): void {
  if (pid === undefined) return
  try {
    process.kill(-pid, 'SIGKILL')
  } catch {
    // the group is already gone
  }
}
