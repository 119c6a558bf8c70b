import {describe, it} from 'vitest'

/**
 * `describe` for suites that need something from the machine (a Docker engine, Chromium): run when
 * it is there; otherwise skipped loudly, or failing when `requireEnv=1` says CI must have it.
 */
export function describeRequiring(
  need: {what: string; missingReason: string | undefined; requireEnv: string},
  name: string,
  body: () => void,
): void {
  if (need.missingReason === undefined) {
    describe(name, body)
    return
  }
  const message = `${name}: ${need.missingReason}`
  if (process.env[need.requireEnv] === '1') {
    describe(name, () => {
      it(`needs ${need.what} (${need.requireEnv}=1)`, () => {
        throw new Error(message)
      })
    })
    return
  }
  process.stderr.write(`\n!!! SKIPPED (no ${need.what}) ${message}\n\n`)
  describe.skip(name, body)
}
