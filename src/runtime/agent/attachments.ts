import path from 'node:path'
import type {ProvidersConfig} from '../config/types.js'
import type {MessageAttachment} from '../shapes/agent-run-contract.js'
import {
  base64Length,
  IMAGE_BASE64_LIMITS,
  IMAGES_PER_REQUEST_BASE64,
  imageTypeOf,
  MAX_IMAGES_PER_MESSAGE,
  type ImageInput,
} from '../shapes/image-input.js'
import {readRegularFile} from '../util/regular-file.js'

/**
 * What the agent is told of a message's files, and the images among them its model sees. The
 * gateway put the files in the workspace (inbox/<message id>/); agent-run reads the images back
 * from there, inside its isolation, and sends them with the message through the LLM channel.
 */

/** The largest image (base64 characters) every provider of the chain takes: the strictest one decides. */
export function imageLimitFor(providers: ProvidersConfig, agentProvider?: string): number {
  const names = [agentProvider || providers.primary, ...(providers.fallback ?? [])]
  const limits = names.flatMap((name) => {
    const kind = providers.providers[name]?.kind
    return kind ? [IMAGE_BASE64_LIMITS[kind]] : []
  })
  return Math.min(IMAGES_PER_REQUEST_BASE64, ...limits)
}

function sizeWords(bytes: number): string {
  if (bytes < 1024) return `${bytes} bytes`
  if (bytes < 1024 * 1024) return `${(bytes / 1024).toFixed(1)} KB`
  return `${(bytes / 1024 / 1024).toFixed(1)} MB`
}

export interface AttachmentsForModel {
  /** Appended to the user's text: every file with its path, type and size, or why it did not come. */
  text: string
  images: ImageInput[]
}

export function attachmentsForModel(
  workspace: string,
  attachments: MessageAttachment[] | undefined,
  imageLimit: number,
): AttachmentsForModel {
  if (!attachments?.length) return {text: '', images: []}
  const images: ImageInput[] = []
  let budget = IMAGES_PER_REQUEST_BASE64
  const lines = attachments.map((attachment) => {
    const what = `${attachment.name} (${attachment.content_type}, ${sizeWords(attachment.size)})`
    if (!attachment.path) return `- ${what}: not received: ${attachment.skipped ?? 'unknown reason'}`
    const line = `- ${attachment.path} (${attachment.content_type}, ${sizeWords(attachment.size)})`
    const file = path.join(workspace, attachment.path)
    const head = readRegularFile(file, 16)
    const type = head && imageTypeOf(head)
    if (!type) return line
    const encoded = base64Length(attachment.size)
    if (encoded > imageLimit)
      return `${line}: an image, not shown to you: it is over the ${sizeWords(Math.floor((imageLimit * 3) / 4))} your model's provider takes per image`
    if (encoded > budget || images.length >= MAX_IMAGES_PER_MESSAGE)
      return `${line}: an image, not shown to you: the message's other images already fill what one request can carry`
    const bytes = readRegularFile(file, attachment.size + 1)
    if (!bytes || bytes.length !== attachment.size)
      return `${line}: an image that changed since it arrived, not shown to you`
    budget -= encoded
    images.push({media_type: type, data: bytes.toString('base64')})
    return `${line}: an image, shown to you with this message`
  })
  return {
    text: `[Files that came with this message, in your workspace:\n${lines.join('\n')}]`,
    images,
  }
}
