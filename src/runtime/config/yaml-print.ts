import YAML from 'yaml'

/**
 * YAML.stringify's output, to the byte, for plain data (objects, arrays, short strings without
 * white space, finite numbers, booleans, null) as `config check` prints: a resolved config is that,
 * and printing it through the yaml library's document model costs milliseconds of a start. Anything
 * else, or a string it would not write plainly or in plain double quotes, goes to YAML.stringify.
 */
export function printYaml(value: unknown): string {
  return plainYaml(value) ?? YAML.stringify(value)
}

/** The same text written here, or undefined where only the library knows it. */
export function plainYaml(value: unknown): string | undefined {
  const lines: string[] = []
  return isCollection(value) && !isEmpty(value) && block(value, '', lines, new Set([value]))
    ? `${lines.join('\n')}\n`
    : undefined
}

type Collection = Record<string, unknown> | unknown[]

function isCollection(value: unknown): value is Collection {
  if (Array.isArray(value)) return true
  if (value === null || typeof value !== 'object') return false
  const proto = Object.getPrototypeOf(value)
  return proto === Object.prototype || proto === null
}

const isEmpty = (value: Collection) =>
  Array.isArray(value) ? value.length === 0 : Object.values(value).every((item) => item === undefined)

/** Appends the block lines of a non-empty collection; false where the output would not be the library's. */
function block(value: Collection, indent: string, lines: string[], seen: Set<object>): boolean {
  if (Array.isArray(value)) {
    for (const item of value)
      if (!entry(`${indent}- `, item === undefined ? null : item, indent, lines, seen, true)) return false
    return true
  }
  for (const [key, item] of Object.entries(value)) {
    if (item === undefined) continue
    const text = scalar(key)
    if (text === undefined || !entry(`${indent}${text}:`, item, indent, lines, seen, false)) return false
  }
  return true
}

/** One map pair (`key:` head) or sequence item (`- ` head); nested collections go two spaces in. */
function entry(
  head: string,
  item: unknown,
  indent: string,
  lines: string[],
  seen: Set<object>,
  inSequence: boolean,
): boolean {
  if (isCollection(item)) {
    if (seen.has(item)) return false // met twice: the library writes an anchor and an alias
    seen.add(item)
    if (isEmpty(item)) {
      lines.push(`${head}${inSequence ? '' : ' '}${Array.isArray(item) ? '[]' : '{}'}`)
      return true
    }
    const inner = `${indent}  `
    if (!inSequence) {
      lines.push(head)
      return block(item, inner, lines, seen)
    }
    // an item's collection starts on the dash's line
    const start = lines.length
    if (!block(item, inner, lines, seen)) return false
    lines[start] = head + (lines[start] as string).slice(inner.length)
    return true
  }
  const text = scalar(item)
  if (text === undefined) return false
  lines.push(`${head}${inSequence ? '' : ' '}${text}`)
  return true
}

// what the library's core schema would read back as another type than a string (null, bool, int, float)
const CORE_SCALARS = [
  /^(?:~|[Nn]ull|NULL)?$/,
  /^(?:[Tt]rue|TRUE|[Ff]alse|FALSE)$/,
  /^0o[0-7]+$/,
  /^[-+]?[0-9]+$/,
  /^0x[0-9a-fA-F]+$/,
  /^(?:[-+]?\.(?:inf|Inf|INF)|\.nan|\.NaN|\.NAN)$/,
  /^[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)[eE][-+]?[0-9]+$/,
  /^[-+]?(?:\.[0-9]+|[0-9]+\.[0-9]*)$/,
]
/** Printable ASCII but quotes and backslash, no white space: never escaped, folded or written as a block. */
const SIMPLE = /^[\x21\x23-\x26\x28-\x5b\x5d-\x7e]{0,200}$/
/** The library's rule for a plain scalar that must be quoted, for strings without white space. */
const NEEDS_QUOTES = /^[,[\]{}#&*!|>'"%@`]|^[?-]$|:$/

function scalar(value: unknown): string | undefined {
  if (value === null) return 'null'
  if (typeof value === 'boolean') return value ? 'true' : 'false'
  if (typeof value === 'number')
    return Number.isFinite(value) && !Object.is(value, -0) ? JSON.stringify(value) : undefined
  if (typeof value !== 'string' || !SIMPLE.test(value) || /^(?:---|\.\.\.)/.test(value)) return undefined
  return NEEDS_QUOTES.test(value) || CORE_SCALARS.some((pattern) => pattern.test(value)) ? `"${value}"` : value
}
