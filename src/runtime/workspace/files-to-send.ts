import path from 'node:path'
import type {AttachmentsConfig} from '../config/types.js'
import {sizeBytes} from '../config/size.js'
import type {FileToSend} from '../shapes/agent-run-contract.js'
import type {FileRefusal, OutboundFile} from '../shapes/outbound-file.js'
import {readAgentFile} from './files.js'

const CONTENT_TYPES: Record<string, string> = {
  '.png': 'image/png',
  '.jpg': 'image/jpeg',
  '.jpeg': 'image/jpeg',
  '.gif': 'image/gif',
  '.webp': 'image/webp',
  '.svg': 'image/svg+xml',
  '.pdf': 'application/pdf',
  '.txt': 'text/plain',
  '.log': 'text/plain',
  '.md': 'text/markdown',
  '.csv': 'text/csv',
  '.html': 'text/html',
  '.json': 'application/json',
  '.yaml': 'application/yaml',
  '.yml': 'application/yaml',
  '.xml': 'application/xml',
  '.zip': 'application/zip',
  '.gz': 'application/gzip',
  '.tar': 'application/x-tar',
}

/** By extension: the agent's bytes are never sniffed, and a platform shows them as what the name says. */
export function contentTypeOf(name: string): string {
  return CONTENT_TYPES[path.extname(name).toLowerCase()] ?? 'application/octet-stream'
}

/** The last component, without control characters, bounded: what users see and platforms store. */
export function displayName(relative: string): string {
  const base =
    relative
      .split(/[\\/]+/)
      .filter(Boolean)
      .at(-1) ?? 'file'
  // eslint-disable-next-line no-control-regex
  const clean = base.replace(/[\u0000-\u001f\u007f-\u009f\u202a-\u202e\u2066-\u2069]/g, '').trim()
  return (clean || 'file').slice(0, 200)
}

export interface FilesToSend {
  files: OutboundFile[]
  refused: FileRefusal[]
}

/**
 * The gateway's own read of the files an agent's result names, after its run, within the
 * agent's `attachments` caps (in order: the first that fit are sent), none that `denied` covers (the
 * agent's own file_access.deny: a run in the host sandbox saw an empty cover there, the gateway would
 * read the real file). Nothing here throws: a file
 * that cannot be sent is a refusal with its reason, for the reply's note and the run's record.
 */
export function readFilesToSend(
  workspace: string,
  requested: FileToSend[],
  caps: AttachmentsConfig,
  denied?: (file: string) => boolean,
): FilesToSend {
  const maxFile = sizeBytes(caps.max_file_size, 'attachments.max_file_size')
  const maxTotal = sizeBytes(caps.max_total_size, 'attachments.max_total_size')
  const files: OutboundFile[] = []
  const refused: FileRefusal[] = []
  let total = 0
  for (const {path: relative} of requested) {
    const name = displayName(relative)
    if (files.length >= caps.max_files) {
      refused.push({name, reason: `over the limit of ${caps.max_files} files per message (attachments.max_files)`})
      continue
    }
    const bound = Math.min(maxFile, maxTotal - total)
    const read = readAgentFile(workspace, relative, bound, denied)
    if (!read.ok) {
      const reason = !read.overLimit
        ? read.reason
        : bound < maxFile
          ? `the files of this message would exceed attachments.max_total_size (${caps.max_total_size})`
          : `${read.reason} (attachments.max_file_size: ${caps.max_file_size})`
      refused.push({name, reason, detail: read.detail})
      continue
    }
    total += read.data.length
    files.push({name, size: read.data.length, content_type: contentTypeOf(name), data: read.data})
  }
  return {files, refused}
}
