/**
 * The longest time the event loop went without running a 1 ms timer, from now until `stop()`:
 * how long some work held it in one stretch.
 */
export function watchLoopGaps(): {stop: () => number} {
  let longest = 0
  let last = performance.now()
  const ticker = setInterval(() => {
    const now = performance.now()
    longest = Math.max(longest, now - last)
    last = now
  }, 1)
  return {
    stop() {
      clearInterval(ticker)
      return Math.max(longest, performance.now() - last)
    },
  }
}
