import {renderedHelpPage} from './help.js'
import {DeferToOclif} from './parse.js'
import type {Command, LiteConfig} from './core.js'
import {oclifInternals} from './oclif-internals.js'
import {writeToFd} from './write.js'

/**
 * The entries of the lite bundles (dist/lite/, one per command and one for help pages, made by
 * scripts/bundle-cli.js), which bin/run.js tries before the full CLI: each runs its command
 * without oclif (see core.ts). They return the exit status, or undefined when this argv is
 * oclif's (anything not certain here; the command has not started then).
 */

type CommandClass = (new (argv: string[], config: LiteConfig) => Command) & {id: string}

/** oclif's debug output (DEBUG=…, MEEPAGATEWAY_DEBUG) is oclif's. */
const oclifDebugWanted = () => process.env.DEBUG !== undefined || process.env.MEEPAGATEWAY_DEBUG !== undefined

const userAgent = (version: string) => `meepagateway/${version} ${process.platform}-${process.arch} node-${process.version}`

/** `[TOPIC] COMMAND args…` for the one command of this bundle. */
export async function runCommandWithoutOclif(argv: string[], id: string, CommandClass: CommandClass, version: string): Promise<number | undefined> {
  const words = id.split(':')
  if (oclifDebugWanted() || words.some((word, index) => argv[index] !== word)) return undefined
  const command = new CommandClass(argv.slice(words.length), {bin: 'meepagateway', userAgent: userAgent(version)})
  try {
    await command._run()
  } catch (error) {
    if (error instanceof DeferToOclif) return undefined
    exitLikeOclif(error as Error & {oclif?: {exit?: number}})
  }
  return typeof process.exitCode === 'number' ? process.exitCode : 0
}

/** A help page as oclif prints it (see help.ts). */
export function printHelpPageWithoutOclif(argv: string[], root: string, version: string): number | undefined {
  if (oclifDebugWanted()) return undefined
  const page = renderedHelpPage(root, argv, userAgent(version))
  if (page === undefined) return undefined
  writeToFd(1, page)
  return 0
}

/** oclif's handle(): the error as oclif prints it, then exit with its code. */
export function exitLikeOclif(error: Error & {oclif?: {exit?: number}; skipOclifErrorHandling?: boolean}): never {
  if (error.message === 'SIGINT') process.exit(1)
  if (!error.skipOclifErrorHandling) writeToFd(2, `${oclifInternals().prettyPrint(error) ?? error.stack}\n`)
  process.exit(error.oclif?.exit ?? 1)
}
