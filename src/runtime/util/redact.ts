/** Values shorter than this are not treated as secrets: redacting "1" would shred every reply. */
const MIN_SECRET_LENGTH = 6

export const REDACTED = '[REDACTED]'

/** Replaces every occurrence of every secret value in text. */
export function redactSecrets(text: string, secrets: Record<string, string> | string[]): string {
  const values = (Array.isArray(secrets) ? secrets : Object.values(secrets))
    .filter((value) => typeof value === 'string' && value.length >= MIN_SECRET_LENGTH)
    .sort((a, b) => b.length - a.length) // longest first, so a secret containing another is removed whole
  let result = text
  for (const value of values) result = result.split(value).join(REDACTED)
  return result
}
