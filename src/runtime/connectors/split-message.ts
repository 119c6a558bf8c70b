/**
 * Splits a reply into ordered chunks of at most `limit` UTF-16 units (at least as strict as every
 * platform's character count). Cuts between paragraphs and code blocks where it can, else between
 * lines, then at a space, and never inside a surrogate pair. A code block cut in two is closed at
 * the end of one chunk and reopened, with its language tag, at the start of the next, so every
 * chunk renders on its own.
 */
export function splitMessage(text: string, limit: number): string[] {
  if (limit < 2) throw new Error('splitMessage: limit must be at least 2')
  if (text.length <= limit) return [text]
  const chunks: string[] = []
  let current = ''
  const flush = () => {
    if (current.trim()) chunks.push(current)
    current = ''
  }
  for (const block of blocks(text)) {
    const joined = current ? `${current}${block.separator}${block.text}` : block.text
    if (joined.length <= limit) {
      current = joined
      continue
    }
    flush()
    if (block.text.length <= limit) {
      current = block.text
      continue
    }
    const pieces = block.fence ? splitCodeBlock(block.text, block.fence, limit) : splitLines(block.text, limit)
    chunks.push(...pieces.slice(0, -1))
    current = pieces.at(-1) ?? ''
  }
  flush()
  return chunks.length > 0 ? chunks : [text]
}

interface Fence {
  /** The opening line as written (```python): reopens the block in the next chunk. */
  opening: string
  /** The fence characters (``` or ~~~~): closes it. */
  marker: string
}

interface Block {
  text: string
  /** What stood between this block and the one before (blank lines). */
  separator: string
  fence?: Fence
}

const FENCE_LINE = /^ {0,3}(`{3,}|~{3,})(.*)$/

/** Paragraphs (runs of lines between blank lines) and code blocks (fence to fence, blank lines included). */
function blocks(text: string): Block[] {
  const result: Block[] = []
  let lines: string[] = []
  let fence: Fence | undefined
  let blankLines = 0
  let separator = ''
  const end = (extra?: {fence: Fence}) => {
    if (lines.length > 0) result.push({text: lines.join('\n'), separator, ...extra})
    lines = []
  }
  const begin = () => {
    separator = result.length > 0 ? '\n'.repeat(blankLines + 1) : ''
    blankLines = 0
  }
  for (const line of text.split('\n')) {
    if (fence) {
      lines.push(line)
      if (closes(line, fence)) {
        end({fence})
        fence = undefined
      }
      continue
    }
    const open = FENCE_LINE.exec(line)
    if (open) {
      end()
      begin()
      fence = {opening: line.trimStart(), marker: open[1] as string}
      lines.push(line)
    } else if (!line.trim()) {
      end()
      blankLines++
    } else {
      if (lines.length === 0) begin()
      lines.push(line)
    }
  }
  end(fence ? {fence} : undefined) // an unclosed block runs to the end, as it renders
  return result
}

function closes(line: string, fence: Fence): boolean {
  const match = FENCE_LINE.exec(line)
  return Boolean(
    match && match[1]?.[0] === fence.marker[0] && match[1].length >= fence.marker.length && !match[2]?.trim(),
  )
}

/** A code block over the limit: pieces of its lines, each closed and reopened with the block's fence. */
function splitCodeBlock(text: string, fence: Fence, limit: number): string[] {
  const lines = text.split('\n')
  lines.shift() // the opening line
  const closing = lines.length > 0 && closes(lines.at(-1) as string, fence) ? lines.pop() : undefined
  const close = `\n${fence.marker}`
  const budget = limit - fence.opening.length - 1 - Math.max(close.length, 1 + (closing?.length ?? 0))
  if (budget < 1) return splitLines(text, limit) // a fence line as long as the limit: plain cuts
  const bodies = splitLines(lines.join('\n'), budget)
  return bodies.map((body, index) => {
    const last = index === bodies.length - 1
    return `${fence.opening}\n${body}${last ? (closing !== undefined ? `\n${closing}` : '') : close}`
  })
}

/** Text with no blocks to cut between: at a line break, else a space, else anywhere (whole code points). */
function splitLines(text: string, limit: number): string[] {
  const chunks: string[] = []
  let rest = text
  while (rest.length > limit) {
    const window = rest.slice(0, limit + 1) // a break right after the limit still counts
    let cut = window.lastIndexOf('\n')
    let skip = 1
    if (cut < limit / 2) cut = Math.max(cut, window.lastIndexOf(' '))
    if (cut <= 0) {
      cut = limit
      skip = 0
      if (isHighSurrogate(rest.charCodeAt(cut - 1))) cut -= 1
    }
    chunks.push(rest.slice(0, cut))
    rest = rest.slice(cut + skip)
  }
  chunks.push(rest)
  return chunks
}

function isHighSurrogate(code: number): boolean {
  return code >= 0xd800 && code <= 0xdbff
}
