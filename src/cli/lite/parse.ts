/**
 * The part of oclif's argv parser the common cases need, for commands started without oclif. It
 * accepts only input whose meaning is certain and gives the same flags and args oclif would;
 * anything else — help, an unknown, repeated or malformed flag, a missing required value, `--` —
 * throws DeferToOclif before the command starts, and bin/run.js hands the same argv to oclif,
 * which parses it (or prints its usual error) as always.
 */

/** Thrown before a command's run() starts: oclif takes this argv instead. */
export class DeferToOclif extends Error {
  constructor(reason: string) {
    super(`left to oclif: ${reason}`)
  }
}

export type LiteFlagKind = 'boolean' | 'string' | 'integer'

/** What the stand-in Flags.* constructors make (see core.ts); keys outside these are oclif's to handle. */
export interface LiteFlag {
  kind: LiteFlagKind
  type: 'boolean' | 'option'
  char?: string
  default?: unknown
  required?: boolean
  min?: number
  max?: number
  description?: string
  summary?: string
  helpGroup?: string
}

export interface LiteArg {
  kind: 'string'
  required?: boolean
  default?: unknown
  description?: string
}

export interface LiteParseInput {
  flags: Record<string, LiteFlag>
  args: Record<string, LiteArg>
  strict: boolean
}

const UNDERSTOOD_FLAG_KEYS = new Set([
  'kind',
  'type',
  'char',
  'default',
  'required',
  'min',
  'max',
  'description',
  'summary',
  'helpGroup',
])
const UNDERSTOOD_ARG_KEYS = new Set(['kind', 'required', 'default', 'description'])

/** The flags and args oclif would give for argv, or DeferToOclif. */
export function parseArgv(
  argv: readonly string[],
  input: LiteParseInput,
): {flags: Record<string, unknown>; args: Record<string, unknown>} {
  if (!input.strict) throw new DeferToOclif('a non-strict command')
  for (const [name, flag] of Object.entries(input.flags)) {
    const unknown = Object.keys(flag).find((key) => !UNDERSTOOD_FLAG_KEYS.has(key))
    if (unknown) throw new DeferToOclif(`flag ${name} uses ${unknown}`)
  }
  for (const [name, arg] of Object.entries(input.args)) {
    const unknown = Object.keys(arg).find((key) => !UNDERSTOOD_ARG_KEYS.has(key))
    if (unknown) throw new DeferToOclif(`arg ${name} uses ${unknown}`)
  }
  const flags: Record<string, unknown> = {}
  const positionals: string[] = []
  for (let i = 0; i < argv.length; i++) {
    const token = argv[i] as string
    if (token === '-' || !token.startsWith('-')) {
      positionals.push(token)
      continue
    }
    const long = /^--([a-z][a-z0-9-]*)(?:=(.*))?$/s.exec(token)
    const name = long
      ? long[1]
      : /^-[a-zA-Z]$/.test(token)
        ? Object.keys(input.flags).find((key) => input.flags[key]?.char === token[1])
        : undefined
    const flag = name === undefined ? undefined : input.flags[name]
    if (name === undefined || !flag) throw new DeferToOclif(`${token} is not a flag this path knows`)
    if (name in flags) throw new DeferToOclif(`--${name} given twice`)
    const inline = long?.[2]
    if (flag.type === 'boolean') {
      if (inline !== undefined) throw new DeferToOclif(`a value for the boolean --${name}`)
      flags[name] = true
      continue
    }
    const value = inline ?? argv[++i]
    // oclif rejects a value that names one of the command's flags, given inline too (`--agent=--json`,
    // `--agent=-n5`: "Flag --agent expects a value"); a value starting with '-' is oclif's either way
    if (value === undefined || value === '' || value.startsWith('-'))
      throw new DeferToOclif(`--${name} without a plain value`)
    flags[name] = flagValue(name, flag, value)
  }
  for (const [name, flag] of Object.entries(input.flags)) {
    if (name in flags) continue
    if (flag.required) throw new DeferToOclif(`--${name} is required`)
    if (typeof flag.default === 'function') throw new DeferToOclif(`--${name} has a computed default`)
    if (flag.default !== undefined) flags[name] = flag.default
  }
  const argNames = Object.keys(input.args)
  if (positionals.length > argNames.length) throw new DeferToOclif('more arguments than the command takes')
  const args: Record<string, unknown> = {}
  for (const [index, name] of argNames.entries()) {
    const arg = input.args[name] as LiteArg
    const value = positionals[index]
    if (value !== undefined) args[name] = value
    else if (arg.required) throw new DeferToOclif(`the argument ${name} is required`)
    else if (typeof arg.default === 'function') throw new DeferToOclif(`the argument ${name} has a computed default`)
    else if (arg.default !== undefined) args[name] = arg.default
  }
  return {flags, args}
}

function flagValue(name: string, flag: LiteFlag, value: string): unknown {
  if (flag.kind === 'string') return value
  // oclif's Flags.integer: an integer within min and max; its error messages are oclif's to print
  if (!/^-?\d+$/.test(value)) throw new DeferToOclif(`--${name} is not an integer`)
  const number = Number.parseInt(value, 10)
  if ((flag.min !== undefined && number < flag.min) || (flag.max !== undefined && number > flag.max))
    throw new DeferToOclif(`--${name} is out of range`)
  return number
}
