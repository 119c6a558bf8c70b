/**
 * What decides what a user sees of oclif (@oclif/core 4) — its CLIError and its JSON printer here,
 * its error printer in print-error.ts (loaded only to print one) — copied small, so a command started without oclif prints exactly what oclif prints
 * without loading oclif's private files (outside its package's exports, free to move in any release).
 * test/cli/oclif-output.test.ts compares each with oclif's own.
 */

/** oclif's Errors.CLIError: the exit code (default 2, as no `exitCodes` are configured), code and suggestions. */
export class CLIError extends Error {
  code: string | undefined
  oclif: {exit?: number} = {}
  skipOclifErrorHandling: boolean | undefined
  suggestions: string[] | undefined

  constructor(error: string | Error, options: {code?: string; exit?: number; suggestions?: string[]} = {}) {
    super(error instanceof Error ? error.message : error)
    this.oclif.exit = options.exit ?? 2
    this.code = options.code
    this.suggestions = options.suggestions
  }
  // oclif's `bang` getter (the marker before each line) is print-error.ts's default: it asks chalk, which loads only to print
}

/**
 * oclif's colorizeJson with no theme (a user theme leaves the command to oclif, see run.ts): the
 * value pretty-printed, a circular reference written as oclif writes it.
 */
export function colorizeJson(json: unknown, options: {pretty?: boolean} = {}): string {
  if (!(options.pretty ?? true)) return typeof json === 'string' ? json : (JSON.stringify(json, circularSafe()) ?? '')
  return JSON.stringify(typeof json === 'string' ? JSON.parse(json) : json, circularSafe(), 2) ?? ''
}

/** oclif's serializer (after json-stringify-safe): a value already on the path becomes "[Circular ~.path]". */
function circularSafe(): (this: unknown, key: string, value: unknown) => unknown {
  const stack: unknown[] = []
  const keys: string[] = []
  return function (this: unknown, key: string, value: unknown) {
    if (stack.length > 0) {
      const position = stack.indexOf(this)
      if (position === -1) {
        stack.push(this)
        keys.push(key)
      } else {
        stack.splice(position + 1)
        keys.splice(position, Number.POSITIVE_INFINITY, key)
      }
      if (stack.includes(value))
        value = stack[0] === value ? '[Circular ~]' : `[Circular ~.${keys.slice(0, stack.indexOf(value)).join('.')}]`
    } else {
      stack.push(value)
    }
    return value
  }
}
