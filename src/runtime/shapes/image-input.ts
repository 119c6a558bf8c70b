import type {ProviderKind} from '../config/types.js'

/** The image formats both wire formats take as model input. */
export type ImageMediaType = 'image/png' | 'image/jpeg' | 'image/gif' | 'image/webp'

/** One image of a user message, as the providers send it (base64, no data: prefix). */
export interface ImageInput {
  media_type: ImageMediaType
  data: string
}

/**
 * The largest image each provider takes, in base64 characters: Anthropic refuses an image whose
 * base64 data is over 5 MB, OpenAI one over 20 MB.
 */
export const IMAGE_BASE64_LIMITS: Record<ProviderKind, number> = {
  anthropic: 5 * 1024 * 1024,
  openai: 20 * 1024 * 1024,
}

/**
 * All images of one request together, in base64 characters: the request crosses the LLM channel
 * as one frame of at most 8 MiB (agent-run/channel.ts), with the conversation beside them.
 */
export const IMAGES_PER_REQUEST_BASE64 = 6 * 1024 * 1024

/** At most this many images in one message. */
export const MAX_IMAGES_PER_MESSAGE = 20

/** The image format of these first bytes (at least 12), by its magic number; undefined for anything else. */
export function imageTypeOf(head: Uint8Array): ImageMediaType | undefined {
  const ascii = (from: number, to: number) => String.fromCharCode(...head.subarray(from, to))
  if (head.length >= 8 && ascii(1, 4) === 'PNG' && head[0] === 0x89 && head[4] === 0x0d && head[5] === 0x0a)
    return 'image/png'
  if (head.length >= 3 && head[0] === 0xff && head[1] === 0xd8 && head[2] === 0xff) return 'image/jpeg'
  if (head.length >= 6 && (ascii(0, 6) === 'GIF87a' || ascii(0, 6) === 'GIF89a')) return 'image/gif'
  if (head.length >= 12 && ascii(0, 4) === 'RIFF' && ascii(8, 12) === 'WEBP') return 'image/webp'
  return undefined
}

/** The base64 length of `bytes` bytes. */
export function base64Length(bytes: number): number {
  return Math.ceil(bytes / 3) * 4
}

/** Why an image a user message carries is not one the providers take; undefined when it is. */
export function imageInputProblem(image: unknown): string | undefined {
  if (!image || typeof image !== 'object') return 'is not {media_type, data}'
  const {media_type: mediaType, data} = image as Record<string, unknown>
  if (typeof data !== 'string' || data.length === 0 || data.length % 4 !== 0 || !/^[A-Za-z0-9+/]+={0,2}$/.test(data))
    return 'has data that is not base64'
  if (data.length > Math.max(...Object.values(IMAGE_BASE64_LIMITS))) return 'is larger than any provider takes'
  const type = imageTypeOf(Buffer.from(data.slice(0, 24), 'base64'))
  if (type === undefined || type !== mediaType) return `is not the ${String(mediaType)} its media_type says`
  return undefined
}
