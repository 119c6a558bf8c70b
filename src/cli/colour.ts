import fs from 'node:fs'
import type {ChalkInstance} from 'chalk'

/**
 * Colour in human-readable output, through chalk: on at a terminal; off for a pipe or a file, with
 * `--no-color`, NO_COLOR (set and not empty) or TERM=dumb; FORCE_COLOR turns it on whatever the
 * stream (0 or false: off), over NO_COLOR as in Node. `--json` output is never coloured (commands
 * log nothing else then). Decided here rather than by chalk's own sniffing, which ignores NO_COLOR
 * and the flag. chalk and node:tty load only when colour is on: a light command whose output is
 * piped pays neither (≈ 3 ms for node:tty alone).
 */
export async function colourOn(fd: 1 | 2, noColorFlag: boolean): Promise<boolean> {
  if (noColorFlag) return false
  const force = process.env.FORCE_COLOR
  if (force !== undefined) return !['0', 'false'].includes(force)
  if (process.env.NO_COLOR || process.env.TERM === 'dumb') return false
  if (!isCharacterDevice(fd)) return false // a pipe or a file, known without node:tty
  return (await import('./terminal.js')).isatty(fd)
}

function isCharacterDevice(fd: number): boolean {
  try {
    return fs.fstatSync(fd).isCharacterDevice()
  } catch {
    return false
  }
}

/**
 * What chalk gives with colour off, without loading it: every style, however chained, returns its
 * text. Not a thenable (no `then`): an async function returns it.
 */
const PLAIN: ChalkInstance = new Proxy((...text: unknown[]) => text.join(' '), {
  get: (_, key) => (key === 'level' ? 0 : key === 'then' ? undefined : PLAIN),
}) as unknown as ChalkInstance

/** chalk for one output stream (1: stdout, 2: stderr). */
export async function colours(fd: 1 | 2, noColorFlag: boolean): Promise<ChalkInstance> {
  if (!(await colourOn(fd, noColorFlag))) return PLAIN
  const {Chalk} = await import('chalk')
  return new Chalk({level: 1})
}

/** Whether argv asks for no colour (before a `--`): for an error met before the flags were parsed. */
export function argvSaysNoColor(argv: readonly string[]): boolean {
  const end = argv.indexOf('--')
  return (end === -1 ? argv : argv.slice(0, end)).includes('--no-color')
}

/**
 * An error as oclif prints it on stderr, coloured: its marker (`›`, oclif's `bang`) and its
 * "Error" heading in red. Set on the error itself, so oclif and the lite CLI print the same bytes.
 */
export async function colourError<E extends Error>(error: E, noColorFlag: boolean): Promise<E> {
  const chalk = await colours(2, noColorFlag)
  // always set: oclif's own marker asks supports-color, which knows neither NO_COLOR nor the flag
  Object.defineProperty(error, 'bang', {value: chalk.red(process.platform === 'win32' ? '»' : '›'), configurable: true})
  if (chalk.level > 0) error.name = chalk.bold.red(error.name || 'Error')
  return error
}
