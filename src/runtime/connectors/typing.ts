/**
 * Repeats a platform's typing pulse until stopped: typing indicators expire after a few
 * seconds, while a run can take minutes. Failures are ignored (typing is cosmetic).
 */
export function keepTyping(pulse: () => Promise<unknown> | void, intervalMs: number): () => void {
  let stopped = false
  const fire = () => {
    if (stopped) return
    try {
      void Promise.resolve(pulse()).catch(() => {})
    } catch {
      // a closed socket: the next pulse or the reply will tell
    }
  }
  fire()
  const timer = setInterval(fire, intervalMs)
  timer.unref()
  return () => {
    stopped = true
    clearInterval(timer)
  }
}
