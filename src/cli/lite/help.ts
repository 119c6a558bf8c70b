import fs from 'node:fs'
import path from 'node:path'

/**
 * Help pages as oclif printed them at build time (scripts/bundle-cli.js runs `--help` for the
 * root, every topic and every command and keeps what they print), for the case those pages were
 * rendered for: output that is not a terminal (oclif then wraps at 80 columns, without colour).
 * At a terminal oclif renders help itself, for the terminal's width and colours.
 */

export const HELP_PAGES_FILE = 'dist/lite/help-pages.json'

export interface HelpPages {
  /** The `bin/version platform-arch node-version` line as it was at build; replaced with today's. */
  userAgent: string
  /** argv joined by spaces ('' for no argv) → what oclif printed on stdout (exit 0, nothing on stderr). */
  pages: Record<string, string>
}

/** The argv forms that print a help page: none, `--help`, `TOPIC`, `TOPIC --help`, `COMMAND... --help`. */
export function helpArgvForms(ids: {commands: string[]; topics: string[]}): string[][] {
  return [
    [],
    ['--help'],
    ...ids.topics.flatMap((topic) => [topic.split(':'), [...topic.split(':'), '--help']]),
    ...ids.commands.map((id) => [...id.split(':'), '--help']),
  ]
}

/** oclif renders help for this process exactly as it did at build: 80 columns, no colour. */
export function renderedHelpApplies(env: NodeJS.ProcessEnv = process.env): boolean {
  return !stdoutIsTerminal() && env.OCLIF_COLUMNS === undefined && env.FORCE_COLOR === undefined
}

/** The page oclif would print for argv, or undefined. */
export function renderedHelpPage(root: string, argv: readonly string[], userAgent: string): string | undefined {
  if (!renderedHelpApplies() || argv.some((word) => !/^[a-z0-9-]+$/.test(word.replace(/^--/, '')))) return undefined
  let help: HelpPages
  try {
    help = JSON.parse(fs.readFileSync(path.join(root, HELP_PAGES_FILE), 'utf8')) as HelpPages
  } catch {
    return undefined // a build in progress: oclif renders it
  }
  const page = help.pages[argv.join(' ')]
  return page === undefined ? undefined : page.split(help.userAgent).join(userAgent)
}

/** isatty(1), asking node:tty (which loads node:net, ≈ 3 ms) only when stdout is a character device at all. */
function stdoutIsTerminal(): boolean {
  try {
    if (!fs.fstatSync(1).isCharacterDevice()) return false
  } catch {
    return false // no stdout
  }
  return process.stdout.isTTY === true
}
