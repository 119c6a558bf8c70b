/**
 * Text from outside the gateway (what an engine or its daemon says: versions, names, labels,
 * errors, build output) made safe to print on a terminal or in a log line: every C0 and C1
 * control character, DEL, the Unicode line and paragraph separators and direction marks are shown
 * as escapes (`\n`, `\r`, `\t`, `\x1b`, `\u2028`, `\u202e`) instead of moving the cursor,
 * clearing the screen, setting the window title, linking, or starting a line of their own. A
 * backslash is shown doubled, so text that spells an escape (`\n` typed out) never passes for
 * one. Everything else is left as it is.
 */
// eslint-disable-next-line no-control-regex -- control characters are exactly what is matched
const CONTROL = /[\\\u0000-\u001f\u007f-\u009f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069]/g

const SHORT: Record<string, string> = {'\n': '\\n', '\r': '\\r', '\t': '\\t', '\\': '\\\\'}

/** `text` with its control characters shown as escapes, for a terminal or a log line. */
export function escapeControls(text: string): string {
  return text.replace(CONTROL, (char) => {
    const code = char.charCodeAt(0)
    return SHORT[char] ?? (code <= 0xff ? `\\x${hex(code, 2)}` : `\\u${hex(code, 4)}`)
  })
}

function hex(code: number, digits: number): string {
  return code.toString(16).padStart(digits, '0')
}
