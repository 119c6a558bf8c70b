import {supportsColor, supportsColorStderr} from 'chalk'
import tty from 'node:tty'
import wrapAnsi from 'wrap-ansi'
import {CLIError} from './oclif-output.js'

/**
 * oclif's error printer (@oclif/core 4, prettyPrint), copied small like the rest of
 * oclif-output.ts: a module of its own, imported only when an error is printed (wrap-ansi and
 * what it loads cost every start otherwise). test/cli/oclif-output.test.ts compares it with oclif's.
 */

interface PrintableError {
  name?: string
  message?: string
  code?: string
  ref?: string
  suggestions?: string[]
  bang?: string
  cause?: unknown
}

/**
 * oclif's prettyPrint (without DEBUG, which the lite CLI leaves to oclif): the error and its
 * causes, wrapped to stderr's width.
 */
export function prettyPrint(error: Error): string {
  const printed: string[] = []
  let current: unknown = error
  let deep = false
  while (current && typeof current === 'object' && 'name' in current && 'message' in current) {
    const {
      bang = current instanceof CLIError ? cliErrorMarker() : undefined,
      code,
      message,
      name,
      ref,
      suggestions,
    } = current as PrintableError
    const formatted = [
      message ? `${name || 'Error'}: ${message}` : undefined,
      code ? `Code: ${code}` : undefined,
      formatSuggestions(suggestions),
      ref ? `Reference: ${ref}` : undefined,
    ]
      .filter(Boolean)
      .join('\n')
    let output = wrapAnsi(`${deep ? 'Caused by: ' : ''}${formatted}`, stderrWidth() - 6, {hard: true, trim: false})
    output = indent(output, 3)
    output = indent(output, 1, {includeEmptyLines: true, indent: bang || ''})
    output = indent(output, 1)
    printed.push(output)
    deep = true
    current = (current as PrintableError).cause ?? null
  }
  return printed.join('\n')
}

function formatSuggestions(suggestions: string[] | undefined): string | undefined {
  if (!suggestions || suggestions.length === 0) return undefined
  if (suggestions.length === 1) return `Try this: ${suggestions[0]}`
  return `Try this:\n${indent(suggestions.map((suggestion) => `* ${suggestion}`).join('\n'), 2)}`
}

/** indent-string 4, as oclif calls it. */
function indent(text: string, count: number, options: {includeEmptyLines?: boolean; indent?: string} = {}): string {
  if (count === 0) return text
  return text.replace(options.includeEmptyLines ? /^/gm : /^(?!\s*$)/gm, (options.indent ?? ' ').repeat(count))
}

/** oclif's errtermwidth: OCLIF_COLUMNS, else stderr's columns at a terminal (40 at least), else 80. */
function stderrWidth(): number {
  const columns = Number.parseInt(process.env.OCLIF_COLUMNS ?? '', 10)
  if (columns) return columns
  if (!tty.isatty(2)) return 80
  const width = process.stderr.getWindowSize()[0]
  return width < 1 ? 80 : Math.max(width, 40)
}

/**
 * A CLIError's marker (oclif's `bang`): red when oclif colours, that is when supports-color finds
 * colour on both stdout and stderr.
 */
function cliErrorMarker(): string {
  const mark = process.platform === 'win32' ? '»' : '›'
  return supportsColor && supportsColorStderr ? `\u001B[31m${mark}\u001B[39m` : mark
}
