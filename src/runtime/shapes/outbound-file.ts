/** A file the gateway read from an agent's workspace to send with its reply. */
export interface OutboundFile {
  /** The file's own name (no directories), safe to show and to upload under. */
  name: string
  size: number
  content_type: string
  data: Buffer
}

/** A file that was not sent, and why (the gateway's checks or the platform's refusal). */
export interface FileRefusal {
  name: string
  /** What the user is told and the record keeps. */
  reason: string
  /** The error in full, for the gateway's log only (it may hold host paths). */
  detail?: string
}

/** One line per file not sent, for the end of the reply: the text always goes out, with this. */
export function refusalNote(refused: FileRefusal[]): string {
  if (refused.length === 0) return ''
  return `\n\n${refused.map((file) => `(File not sent: ${file.name}: ${file.reason}.)`).join('\n')}`
}
