/** A real 1×1 PNG, for image attachments that a model would accept. */
export const TINY_PNG = Buffer.from(
  'iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg==',
  'base64',
)

/** A file of `bytes` bytes that starts like a PNG (what the magic-number check reads). */
export function pngOfSize(bytes: number): Buffer {
  const file = Buffer.alloc(bytes)
  TINY_PNG.copy(file, 0, 0, Math.min(TINY_PNG.length, bytes))
  return file
}

/** The text of the last user message of a fake LLM request, in either wire format. */
export function lastUserText(request: {body: any}): string {
  const last = [...request.body.messages].reverse().find((message: any) => message.role === 'user')
  if (typeof last.content === 'string') return last.content
  return last.content
    .filter((part: any) => part.type === 'text')
    .map((part: any) => part.text)
    .join('\n')
}
