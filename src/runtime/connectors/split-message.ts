/**
 * Splits a reply into ordered chunks of at most `limit` UTF-16 units (at least as strict as
 * every platform's character count). Prefers to cut at a paragraph, then a line, then a space,
 * and never inside a surrogate pair.
 */
export function splitMessage(text: string, limit: number): string[] {
  if (limit < 2) throw new Error('splitMessage: limit must be at least 2')
  const chunks: string[] = []
  let rest = text
  while (rest.length > limit) {
    const window = rest.slice(0, limit)
    let cut = lastBreak(window, '\n\n')
    if (cut < limit / 2) cut = Math.max(cut, lastBreak(window, '\n'))
    if (cut < limit / 2) cut = Math.max(cut, lastBreak(window, ' '))
    if (cut <= 0) {
      cut = limit
      if (isHighSurrogate(rest.charCodeAt(cut - 1))) cut -= 1
    }
    const chunk = rest.slice(0, cut).trimEnd()
    if (chunk) chunks.push(chunk)
    rest = rest.slice(cut).replace(/^\n+/, '')
  }
  if (rest.trim() || chunks.length === 0) chunks.push(rest)
  return chunks
}

/** Index just after the last `separator` in `window` (so the separator stays with the earlier chunk), or 0. */
function lastBreak(window: string, separator: string): number {
  const index = window.lastIndexOf(separator)
  return index <= 0 ? 0 : index + separator.length
}

function isHighSurrogate(code: number): boolean {
  return code >= 0xd800 && code <= 0xdbff
}
