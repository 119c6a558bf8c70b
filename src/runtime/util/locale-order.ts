/**
 * `a.localeCompare(b)`, without ICU where that is exact. A process's first localeCompare builds
 * ICU's collator (≈ 5 ms, the largest cost of compiling a sandbox policy). Under the default
 * locale en-US (CLDR root collation), printable ASCII compares by these weights: each character's
 * primary weight (letters regardless of case, punctuation before digits before letters), then,
 * where those are all equal, lowercase before uppercase. Other strings or locales: localeCompare.
 */
export function localeOrder(a: string, b: string): number {
  return asciiLocaleOrder(a, b) ?? a.localeCompare(b)
}

// printable ASCII in root collation order; a letter and its capital share a primary weight
const ROOT_ORDER = ' _-,;:!?.\'"()[]{}@*/\\&#%`^+<=>|~$0123456789aAbBcCdDeEfFgGhHiIjJkKlLmMnNoOpPqQrRsStTuUvVwWxXyYzZ'
const PRIMARY = new Uint8Array(128)
for (let index = 0, weight = 0; index < ROOT_ORDER.length; index++) {
  const code = ROOT_ORDER.charCodeAt(index)
  if (!(code >= 65 && code <= 90)) weight++ // a capital follows its small letter with the same weight
  PRIMARY[code] = weight
}
const isUpper = (code: number) => code >= 65 && code <= 90

let rootLocale: boolean | undefined

/** The exact order for two printable-ASCII strings under en-US, or undefined. */
export function asciiLocaleOrder(a: string, b: string): number | undefined {
  // PluralRules resolves the default locale as the collator does, without loading collation data
  rootLocale ??= new Intl.PluralRules().resolvedOptions().locale === 'en-US'
  if (!rootLocale || !isPrintableAscii(a) || !isPrintableAscii(b)) return undefined
  const length = Math.min(a.length, b.length)
  for (let i = 0; i < length; i++) {
    const difference = (PRIMARY[a.charCodeAt(i)] as number) - (PRIMARY[b.charCodeAt(i)] as number)
    if (difference !== 0) return difference < 0 ? -1 : 1
  }
  if (a.length !== b.length) return a.length < b.length ? -1 : 1
  for (let i = 0; i < length; i++) {
    const upperA = isUpper(a.charCodeAt(i))
    if (upperA !== isUpper(b.charCodeAt(i))) return upperA ? 1 : -1
  }
  return 0
}

function isPrintableAscii(text: string): boolean {
  for (let i = 0; i < text.length; i++) {
    const code = text.charCodeAt(i)
    if (code < 32 || code > 126) return false
  }
  return true
}
