import {sizeBytes} from './size.js'
import type {AttachmentsConfig} from './types.js'

/** An agent's `attachments` section in bytes: the caps of one message's files, in and out. */
export interface AttachmentCaps {
  fileBytes: number
  files: number
  totalBytes: number
}

export function attachmentCaps(config: AttachmentsConfig): AttachmentCaps {
  return {
    fileBytes: sizeBytes(config.max_file_size, 'attachments.max_file_size'),
    files: config.max_files,
    totalBytes: sizeBytes(config.max_total_size, 'attachments.max_total_size'),
  }
}

/** `1.5 MB`, `25 MB`, `300 KB`, `12 bytes`: sizes in what users are told (binary units, as the config's `25m`). */
export function describeSize(bytes: number): string {
  if (bytes < 1024) return `${bytes} bytes`
  const [value, unit] =
    bytes < 1024 ** 2 ? [bytes / 1024, 'KB'] : bytes < 1024 ** 3 ? [bytes / 1024 ** 2, 'MB'] : [bytes / 1024 ** 3, 'GB']
  return `${Number.isInteger(value) ? value : value.toFixed(1)} ${unit}`
}
