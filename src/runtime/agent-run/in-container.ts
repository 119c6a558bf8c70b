import fs from 'node:fs'

/**
 * Set by the container runner. agent-run then reports a command the kernel killed for memory
 * itself, so the host need not `docker inspect` every finished run for OOMKilled (it still does
 * when agent-run itself dies).
 */
export const IN_CONTAINER_ENV = 'MEEPA_IN_CONTAINER'

// The container's own memory cgroup, as Docker mounts it: cgroup v2, then v1 (kernel 4.13+).
const OOM_COUNTERS = ['/sys/fs/cgroup/memory.events', '/sys/fs/cgroup/memory/memory.oom_control']

/** How many processes the kernel has OOM-killed in this container; undefined outside one. */
export function containerOomKills(env: NodeJS.ProcessEnv = process.env): number | undefined {
  if (env[IN_CONTAINER_ENV] !== '1') return undefined
  for (const file of OOM_COUNTERS) {
    let text: string
    try {
      text = fs.readFileSync(file, 'utf8')
    } catch {
      continue
    }
    const count = /^oom_kill (\d+)$/m.exec(text)?.[1]
    if (count !== undefined) return Number(count)
  }
  return undefined
}
