import fs from 'node:fs'
import os from 'node:os'
import path from 'node:path'
import {renderedHelpPage} from './help.js'
import {DeferToOclif} from './parse.js'
import type {Command, LiteConfig} from './core.js'
import {writeToFd} from './write.js'

/**
 * The entries of the lite bundles (dist/lite/, one per command and one for help pages, made by
 * scripts/bundle-cli.js), which bin/run.js tries before the full CLI: each runs its command
 * without oclif (see core.ts). They return the exit status, or undefined when this argv is
 * oclif's (anything not certain here; the command has not started then).
 */

type CommandClass = (new (argv: string[], config: LiteConfig) => Command) & {id: string}

/**
 * Where oclif prints more than these paths do, or otherwise: its debug output (DEBUG=…,
 * MEEPAGATEWAY_DEBUG), and the warning @oclif/core prints as it loads when the current directory
 * no longer exists.
 */
export function oclifPrintsOtherwise(): boolean {
  if (process.env.DEBUG !== undefined || process.env.MEEPAGATEWAY_DEBUG !== undefined) return true
  // Node warns that FORCE_COLOR (the values that turn colour on) overrides them when oclif asks a
  // stream for its colours
  const {FORCE_COLOR, NO_COLOR, NODE_DISABLE_COLORS} = process.env
  if (
    ['', '1', 'true', '2', '3'].includes(FORCE_COLOR ?? '0') &&
    (NO_COLOR !== undefined || NODE_DISABLE_COLORS !== undefined)
  )
    return true
  try {
    process.cwd()
  } catch {
    return true // oclif: "WARNING: current directory does not exist"
  }
  return false
}

/**
 * A user theme (CONFIG_DIR/theme.json, Config.loadTheme): oclif colours JSON output with it
 * whenever colour is on (a terminal, FORCE_COLOR), and core.ts's logJson has no theme.
 */
function userThemeExists(): boolean {
  const scoped = (name: string) => process.env[`MEEPAGATEWAY_${name}`]
  if (['1', 'true'].includes(scoped('DISABLE_THEME') ?? '')) return false
  const home = process.env.HOME || os.homedir() || os.tmpdir()
  const configDir =
    scoped('CONFIG_DIR') || path.join(process.env.XDG_CONFIG_HOME || path.join(home, '.config'), 'meepagateway')
  return fs.existsSync(path.resolve(configDir, 'theme.json'))
}

/**
 * oclif's Config.userAgent, the VERSION line of the root help page: its platform is `wsl` under
 * WSL (oclif asks is-wsl) and its arch `x86` for ia32. A dynamic import: is-wsl reads /proc as it
 * loads, which only a help page needs.
 */
export async function oclifUserAgent(version: string): Promise<string> {
  const {default: isWsl} = await import('is-wsl')
  return `meepagateway/${version} ${isWsl ? 'wsl' : process.platform}-${process.arch === 'ia32' ? 'x86' : process.arch} node-${process.version}`
}

/** `[TOPIC] COMMAND args…` for the one command of this bundle. */
export async function runCommandWithoutOclif(
  argv: string[],
  id: string,
  CommandClass: CommandClass,
): Promise<number | undefined> {
  const words = id.split(':')
  if (oclifPrintsOtherwise() || words.some((word, index) => argv[index] !== word) || userThemeExists()) return undefined
  const command = new CommandClass(argv.slice(words.length), {bin: 'meepagateway'})
  try {
    await command._run()
  } catch (error) {
    if (error instanceof DeferToOclif) return undefined
    await exitLikeOclif(error as Error & {oclif?: {exit?: number}})
  }
  return typeof process.exitCode === 'number' ? process.exitCode : 0
}

/** A help page as oclif prints it (see help.ts). */
export async function printHelpPageWithoutOclif(
  argv: string[],
  root: string,
  version: string,
): Promise<number | undefined> {
  if (oclifPrintsOtherwise()) return undefined
  const page = renderedHelpPage(root, argv, await oclifUserAgent(version))
  if (page === undefined) return undefined
  writeToFd(1, page)
  return 0
}

/** oclif's handle(): the error as oclif prints it, then exit with its code. */
export async function exitLikeOclif(
  error: Error & {oclif?: {exit?: number}; skipOclifErrorHandling?: boolean},
): Promise<never> {
  if (error.message === 'SIGINT') process.exit(1)
  if (!error.skipOclifErrorHandling) writeToFd(2, `${(await import('./print-error.js')).prettyPrint(error)}\n`)
  process.exit(error.oclif?.exit ?? 1)
}
