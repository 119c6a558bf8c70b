import {describeSize, type AttachmentCaps} from '../config/attachment-caps.js'
import {DownloadRefused} from '../http/download.js'
import type {MessageAttachment} from '../shapes/agent-run-contract.js'
import {errorCode} from '../util/errors.js'
import {writeNewWorkspaceFile} from '../workspace/files.js'

/**
 * A file a message came with, as its connector found it: the bytes are read (downloaded) only
 * when the message's run starts, by the gateway, into the agent's workspace.
 */
export interface IncomingFile {
  /** As the sender named it (sanitised when written). */
  name: string
  contentType?: string
  /** What the platform says the size is: only used to skip a file early, never trusted. */
  declaredSize?: number
  /** Why this file cannot be fetched at all (Slack without the files:read scope). */
  unavailable?: string
  /** The bytes; stops with DownloadRefused past `maxBytes` or for anything not allowed. */
  read(options: {maxBytes: number; signal?: AbortSignal}): AsyncIterable<Uint8Array>
}

/** Where a message's files land, relative to the workspace. */
export const INBOX_DIRECTORY = 'inbox'

const MAX_NAME_BYTES = 120
// eslint-disable-next-line no-control-regex -- control characters are exactly what is matched
const CONTROL = /[\u0000-\u001f\u007f-\u009f\u200e\u200f\u202a-\u202e\u2066-\u2069]/g

/** Cuts `text` to at most `bytes` bytes of UTF-8 without splitting a character. */
function truncateUtf8(text: string, bytes: number): string {
  let result = ''
  let used = 0
  for (const char of text) {
    used += Buffer.byteLength(char)
    if (used > bytes) break
    result += char
  }
  return result
}

/**
 * A platform's file name made safe as one file name: no separators, no control or direction
 * characters, no leading dots (no hidden files, no `..`), at most 120 bytes with its extension kept.
 */
export function sanitiseFileName(name: string, fallback = 'file'): string {
  let safe = name
    .normalize('NFC')
    .replace(/[/\\]/g, '_')
    .replace(CONTROL, '_')
    .replace(/^[\s.]+/, '')
    .trim()
  if (Buffer.byteLength(safe) > MAX_NAME_BYTES) {
    const dot = safe.lastIndexOf('.')
    const extension = dot > 0 && safe.length - dot <= 16 ? safe.slice(dot) : ''
    safe =
      truncateUtf8(safe.slice(0, safe.length - extension.length), MAX_NAME_BYTES - Buffer.byteLength(extension)) +
      extension
  }
  return safe || fallback
}

/** `image/png`; anything that is not a plain `type/subtype` is `application/octet-stream`. */
export function sanitiseContentType(contentType: string | undefined): string {
  const type = contentType?.split(';')[0]?.trim().toLowerCase()
  return type && /^[a-z0-9][a-z0-9.+-]*\/[a-z0-9][a-z0-9.+-]*$/.test(type) && type.length <= 100
    ? type
    : 'application/octet-stream'
}

/**
 * The room limits.disk leaves the agent's workspace when a message's files arrive: measured
 * before they are received, so a workspace at its limit takes none (its run would fail with
 * E_DISK anyway) and the host's disk is not filled through `inbox/` where the limit is measured,
 * not a filesystem of its own.
 */
export interface DiskRoom {
  /** Bytes the workspace may still take (0 or less: none). */
  bytes: number
  /** Why a file that does not fit is not received, and what to do, in the user's words. */
  full: string
}

/** What an entry takes at least, as the measurement counts it (src/sandbox/directory-tree.ts): whole 4 KiB blocks. */
const ENTRY_BYTES = 4096

function onDisk(size: number): number {
  return Math.max(ENTRY_BYTES, Math.ceil(size / ENTRY_BYTES) * ENTRY_BYTES)
}

/** Stops the stream once it is past `maxBytes`, with the cap's own words. */
async function* capped(chunks: AsyncIterable<Uint8Array>, maxBytes: number, tooLarge: () => string) {
  let size = 0
  for await (const chunk of chunks) {
    size += chunk.length
    if (size > maxBytes) throw new DownloadRefused('too-large', tooLarge())
    yield chunk
  }
}

/**
 * Why a file could not be received, as its sender reads it: the error's code, never its message,
 * which holds host paths (the inbox, the agent's volume); the whole message goes to the gateway's log.
 */
export function notReceived(name: string, error: unknown, log: (line: string) => void): string {
  log(`file ${JSON.stringify(name)} not received: ${JSON.stringify(String((error as Error)?.message ?? error))}`)
  return `it could not be received (${errorCode(error)}; the gateway's log has the details)`
}

/**
 * Receives a message's files into `inbox/<message id>/` of the workspace, in order, every one of
 * them: each is skipped (with the reason the user is told) when it is past the caps or the room
 * `disk` leaves, refused by the download's rules or fails; the others still arrive. Never throws
 * for one file.
 */
export async function receiveFiles(
  files: IncomingFile[],
  options: {
    workspace: string
    messageId: string
    caps: AttachmentCaps
    /** What limits.disk leaves the workspace (none: only the caps bound what is received). */
    disk?: DiskRoom
    /** The gateway's log: what went wrong in full, for the operator. */
    log: (line: string) => void
    signal?: AbortSignal
  },
): Promise<MessageAttachment[]> {
  const {caps, disk} = options
  const directory = `${INBOX_DIRECTORY}/${sanitiseFileName(options.messageId, 'message')}`
  const perFile = `the limit per file (${describeSize(caps.fileBytes)}, attachments.max_file_size)`
  const perMessage = `the limit for all files of a message (${describeSize(caps.totalBytes)}, attachments.max_total_size)`
  const received: MessageAttachment[] = []
  let total = 0
  // what the workspace may still take, less the folders the files land in (inbox/, inbox/<message id>/)
  let diskLeft = disk ? disk.bytes - 2 * ENTRY_BYTES : Infinity
  for (const [index, file] of files.entries()) {
    const name = sanitiseFileName(file.name)
    const entry = {name, content_type: sanitiseContentType(file.contentType), size: file.declaredSize ?? 0}
    const skip = (why: string) => received.push({...entry, skipped: why})
    if (index >= caps.files) {
      skip(`a message may carry ${caps.files} file(s) (attachments.max_files)`)
      continue
    }
    if (file.unavailable) {
      skip(file.unavailable)
      continue
    }
    if (file.declaredSize !== undefined && file.declaredSize > caps.fileBytes) {
      skip(`it is larger than ${perFile}`)
      continue
    }
    if (file.declaredSize !== undefined && total + file.declaredSize > caps.totalBytes) {
      skip(`it would take the message past ${perMessage}`)
      continue
    }
    // the bytes whose blocks fit in what limits.disk leaves (none: not even an empty file's entry)
    const diskRoom = diskLeft < ENTRY_BYTES ? -1 : Math.floor(diskLeft / ENTRY_BYTES) * ENTRY_BYTES
    if (disk && (diskRoom < 0 || (file.declaredSize !== undefined && file.declaredSize > diskRoom))) {
      skip(disk.full)
      continue
    }
    const room = Math.min(caps.fileBytes, caps.totalBytes - total, diskRoom)
    const tooLarge = () =>
      disk && room === diskRoom
        ? disk.full
        : room === caps.fileBytes
          ? `it is larger than ${perFile}`
          : `it would take the message past ${perMessage}`
    try {
      const bytes = capped(file.read({maxBytes: room, signal: options.signal}), room, tooLarge)
      const written = await writeNewWorkspaceFile(options.workspace, directory, name, bytes)
      total += written.size
      diskLeft -= onDisk(written.size)
      received.push({...entry, size: written.size, path: written.relative})
    } catch (error) {
      if (options.signal?.aborted) throw error
      if (error instanceof DownloadRefused) skip(error.kind === 'too-large' ? tooLarge() : refusalWords(error))
      else skip(notReceived(name, error, options.log))
    }
  }
  return received
}

function refusalWords(error: DownloadRefused): string {
  switch (error.kind) {
    case 'origin':
    case 'address':
    case 'redirects':
      return `the gateway refused to download it: ${error.reason}`
    default:
      return `it could not be downloaded: ${error.reason}`
  }
}

/** The line the user gets under the reply for the files that did not reach the agent (empty when all did). */
export function skippedFilesNote(attachments: MessageAttachment[] | undefined): string {
  const skipped = (attachments ?? []).filter((attachment) => attachment.skipped)
  if (skipped.length === 0) return ''
  return skipped.map((attachment) => `(${attachment.name} was not received: ${attachment.skipped}.)`).join('\n')
}
