import {createRequire} from 'node:module'
import path from 'node:path'

/**
 * The few pieces of @oclif/core that decide what a user sees — its CLIError, the error printer and
 * the JSON printer — so a command started without oclif prints exactly what oclif prints. They
 * are internal files (not in the package's exports): scripts/bundle-cli.js replaces this module
 * with static requires of the same files, so the bundle holds them and never reads node_modules.
 */

export interface OclifInternals {
  CLIError: new (message: string | Error, options?: {code?: string; exit?: number; suggestions?: string[]; ref?: string}) => Error & {oclif: {exit?: number}; code?: string}
  prettyPrint: (error: Error) => string | undefined
  colorizeJson: (json: unknown, options?: {pretty?: boolean}) => string
}

let loaded: OclifInternals | undefined

export function oclifInternals(): OclifInternals {
  if (loaded) return loaded
  const require = createRequire(import.meta.url)
  const lib = path.dirname(require.resolve('@oclif/core'))
  loaded = {
    CLIError: require(path.join(lib, 'errors/errors/cli.js')).CLIError,
    prettyPrint: require(path.join(lib, 'errors/errors/pretty-print.js')).default,
    colorizeJson: require(path.join(lib, 'ux/colorize-json.js')).default,
  }
  return loaded
}
