import {bufferSource, type ByteSource} from './spooled-bytes.js'

/**
 * The few tar records the engine-side workspace sync exchanges (POSIX/ustar with PAX and GNU long
 * names): written for regular files, directories and symbolic links, read from whatever an engine sends. What is
 * read is only described, never written anywhere here: the caller decides what to trust.
 */

export interface TarEntry {
  /** As the archive names it (not yet checked: may be absolute or hold `..`). */
  name: string
  /** '0' file, '5' directory, '2' symlink, '1' hardlink, '6' FIFO, ...; '0' for the old '\0'. */
  type: string
  mode: number
  mtimeMs: number
  data: Buffer
  /** A link's target ('2', '1'), as the archive says it: never followed here. */
  linkname?: string
}

const BLOCK = 512

function octal(value: number, width: number): string {
  return value.toString(8).padStart(width - 1, '0') + '\0'
}

function header(name: string, type: string, mode: number, size: number, mtimeMs: number, linkname = ''): Buffer {
  const block = Buffer.alloc(BLOCK)
  block.write(name, 0, 100, 'utf8')
  block.write(linkname, 157, 100, 'utf8')
  block.write(octal(mode & 0o7777, 8), 100, 'ascii')
  block.write(octal(0, 8), 108, 'ascii')
  block.write(octal(0, 8), 116, 'ascii')
  block.write(octal(size, 12), 124, 'ascii')
  block.write(octal(Math.max(0, Math.floor(mtimeMs / 1000)), 12), 136, 'ascii')
  block.write(type, 156, 'ascii')
  block.write('ustar\u000000', 257, 'ascii')
  block.write('        ', 148, 'ascii')
  let sum = 0
  for (const byte of block) sum += byte
  block.write(octal(sum, 7) + ' ', 148, 'ascii')
  return block
}

function padded(data: Buffer): Buffer[] {
  const rest = data.length % BLOCK
  return rest === 0 ? [data] : [data, Buffer.alloc(BLOCK - rest)]
}

/** A PAX record `LEN path=VALUE\n` (LEN counts itself). */
function paxRecord(key: string, value: string): string {
  const body = ` ${key}=${value}\n`
  const bytes = Buffer.byteLength(body)
  let length = bytes + 1
  while (String(length).length + bytes !== length) length = String(length).length + bytes
  return `${length}${body}`
}

/** One tar archive of the given entries (names relative, `/`-separated); a link ('2') has its `linkname`. */
export type TarInput = Omit<TarEntry, 'type'> & {type: '0' | '5' | '2'}

/** The largest size a ustar header's 11 octal digits hold (8 GiB - 1); past it, a PAX `size`. */
const MAX_USTAR_SIZE = 0o77777777777

/** What a ustar field holds as it is: short, printable ASCII. */
const fitsUstar = (text: string) => Buffer.byteLength(text) <= 99 && /^[\x20-\x7e]*$/.test(text)

/**
 * The header block(s) of one file ('0', of `size` bytes), folder ('5') or symbolic link ('2'): PAX
 * for what ustar cannot hold.
 */
export function tarHeader(entry: Omit<TarInput, 'data'>, size: number): Buffer {
  const name = entry.type === '5' ? `${entry.name}/` : entry.name
  const bytes = entry.type === '0' ? size : 0
  const linkname = entry.type === '2' ? (entry.linkname ?? '') : ''
  let pax = ''
  if (!fitsUstar(name)) pax += paxRecord('path', name)
  if (!fitsUstar(linkname)) pax += paxRecord('linkpath', linkname)
  if (bytes > MAX_USTAR_SIZE) pax += paxRecord('size', String(bytes))
  const main = header(
    name.slice(0, 99),
    entry.type,
    entry.mode,
    bytes > MAX_USTAR_SIZE ? 0 : bytes,
    entry.mtimeMs,
    fitsUstar(linkname) ? linkname : '',
  )
  if (!pax) return main
  const records = Buffer.from(pax)
  return Buffer.concat([header('././@PaxHeader', 'x', 0o644, records.length, entry.mtimeMs), ...padded(records), main])
}

/** The zeros that fill a member of `size` bytes to a whole block. */
export function tarPadding(size: number): Buffer {
  return Buffer.alloc((BLOCK - (size % BLOCK)) % BLOCK)
}

/** The two zero blocks that end an archive. */
export const TAR_END_BLOCKS = BLOCK * 2

export function writeTar(entries: TarInput[]): Buffer {
  const parts: Buffer[] = []
  for (const entry of entries) {
    const size = entry.type === '0' ? entry.data.length : 0
    parts.push(tarHeader(entry, size))
    if (size > 0) parts.push(entry.data, tarPadding(size))
  }
  parts.push(Buffer.alloc(TAR_END_BLOCKS))
  return Buffer.concat(parts)
}

function field(block: Buffer, start: number, length: number): string {
  const raw = block.subarray(start, start + length)
  const end = raw.indexOf(0)
  return raw.subarray(0, end === -1 ? length : end).toString('utf8')
}

function numeric(block: Buffer, start: number, length: number, what: string): number {
  if ((block[start] ?? 0) & 0x80) throw new Error(`tar: a ${what} in base-256 (over 8 GiB) is refused`)
  const text = field(block, start, length).trim()
  const value = text === '' ? 0 : parseInt(text, 8)
  if (!Number.isSafeInteger(value) || value < 0) throw new Error(`tar: the ${what} field is not a number`)
  return value
}

function paxValues(data: Buffer): Map<string, string> {
  const values = new Map<string, string>()
  let at = 0
  while (at < data.length) {
    // "LENGTH KEY=VALUE\n": a length of a few digits, no leading zero, ending the record with its
    // newline (a length read from anywhere, or one of 1 over a run of zeros, walks it byte by byte)
    const space = data.subarray(at, at + 16).indexOf(0x20)
    const digits = space === -1 ? '' : data.subarray(at, at + space).toString('ascii')
    const length = Number(digits)
    if (
      !/^[1-9]\d*$/.test(digits) ||
      length <= space + 1 ||
      at + length > data.length ||
      data[at + length - 1] !== 0x0a
    )
      throw new Error('tar: a damaged PAX header')
    const record = data.subarray(at + space + 1, at + length - 1).toString('utf8')
    const equals = record.indexOf('=')
    if (equals > 0) values.set(record.slice(0, equals), record.slice(equals + 1))
    at += length
  }
  return values
}

/** A PAX header's `size`, if it has one; one that is not a whole number of bytes would send a walk anywhere, even back. */
function paxSize(values: Map<string, string>): number | undefined {
  const size = values.get('size')
  if (size === undefined) return undefined
  if (!/^\d{1,15}$/.test(size)) throw new Error('tar: a PAX size that is not a size')
  return Number(size)
}

/** The most a PAX or GNU long-name record may hold: a path is at most a few KiB, these are read whole. */
const MAX_META_BYTES = 1 << 20

function metaSize(size: number): number {
  if (size > MAX_META_BYTES) throw new Error(`tar: a PAX or long-name record of ${size} bytes is refused`)
  return size
}

/**
 * Finds where a tar arriving in pieces ends (its two zero blocks), so that a stream carrying one
 * needs no length up front nor its end: `feed` each piece; `end` is the archive's length once
 * found. Holds only the header it is reading (a PAX record at most), never the archive.
 */
export class TarEnd {
  end: number | undefined
  /** Bytes fed so far. */
  private received = 0
  /** Where the next header starts. */
  private at = 0
  /** What was fed from `at` on, while the header there is not whole: pieces, joined once there are `need` bytes. */
  private held: Buffer[] = []
  private heldBytes = 0
  /** Bytes from `at` the walk needs before it can go on (a block, two zero ones, a PAX header whole). */
  private need = BLOCK
  private paxSize: number | undefined

  /** Takes the next piece; throws on a header that is not tar's. */
  feed(piece: Buffer): void {
    if (this.end !== undefined) return
    const pieceAt = this.received
    this.received += piece.length
    if (this.at >= this.received) return // inside an entry's data
    const from = piece.subarray(Math.max(0, this.at - pieceAt))
    this.held.push(from)
    this.heldBytes += from.length
    if (this.heldBytes < this.need) return
    let held = this.held.length > 1 ? Buffer.concat(this.held) : from
    this.held = []
    this.heldBytes = 0
    this.need = BLOCK
    while (held.length >= BLOCK) {
      const block = held.subarray(0, BLOCK)
      if (block.every((byte) => byte === 0)) {
        if (held.length < 2 * BLOCK) {
          this.need = 2 * BLOCK
          break
        }
        if (!held.subarray(BLOCK, 2 * BLOCK).every((byte) => byte === 0))
          throw new Error('tar: one zero block inside the archive')
        this.end = this.at + 2 * BLOCK
        return
      }
      const size = this.paxSize ?? numeric(block, 124, 12, 'size')
      const next = this.at + BLOCK + Math.ceil(size / BLOCK) * BLOCK
      if (!(next > this.at)) throw new Error('tar: a header that does not move forward')
      const type = field(block, 156, 1)
      if (type === 'x') {
        if (BLOCK + metaSize(size) > held.length) {
          this.need = BLOCK + size // its records are needed whole
          break
        }
        this.paxSize = paxSize(paxValues(held.subarray(BLOCK, BLOCK + size)))
      } else this.paxSize = undefined
      held = next - this.at < held.length ? held.subarray(next - this.at) : Buffer.alloc(0)
      this.at = next
    }
    if (held.length > 0) {
      this.held = [held]
      this.heldBytes = held.length
    }
  }
}

/** An entry as its header describes it, its data left where it is (`size` bytes from `dataAt`). */
export type TarHeaderEntry = Omit<TarEntry, 'data'> & {size: number; dataAt: number}

/**
 * Every entry of an archive read by position (in memory or a spooled file), in order, data not
 * read; `maxBytes` bounds what one entry may hold.
 */
export function* tarEntries(archive: ByteSource, maxBytes = Number.POSITIVE_INFINITY): Generator<TarHeaderEntry> {
  let at = 0
  let longName: string | undefined
  let longLink: string | undefined
  let pax = new Map<string, string>()
  while (at + BLOCK <= archive.length) {
    const block = archive.read(at, BLOCK)
    if (block.every((byte) => byte === 0)) return
    const type = field(block, 156, 1) || '0'
    const size = paxSize(pax) ?? numeric(block, 124, 12, 'size')
    if (size > maxBytes) throw new Error(`tar: an entry of ${size} bytes is over the ${maxBytes} allowed`)
    const dataAt = at + BLOCK
    if (dataAt + size > archive.length) throw new Error('tar: the archive ends inside an entry')
    at += BLOCK + Math.ceil(size / BLOCK) * BLOCK
    if (type === 'x') {
      pax = paxValues(archive.read(dataAt, metaSize(size)))
      continue
    }
    if (type === 'L' || type === 'K') {
      const long = archive.read(dataAt, metaSize(size)).toString('utf8').replace(/\0+$/, '')
      if (type === 'L') longName = long
      else longLink = long
      continue
    }
    if (type === 'g') continue
    const prefix = field(block, 345, 155)
    const plain = field(block, 0, 100)
    const name = pax.get('path') ?? longName ?? (prefix ? `${prefix}/${plain}` : plain)
    const linkname =
      type === '1' || type === '2' ? (pax.get('linkpath') ?? longLink ?? field(block, 157, 100)) : undefined
    yield {
      name,
      type: type === '\0' ? '0' : type,
      mode: numeric(block, 100, 8, 'mode'),
      mtimeMs: numeric(block, 136, 12, 'mtime') * 1000,
      size,
      dataAt,
      ...(linkname !== undefined ? {linkname} : {}),
    }
    longName = undefined
    longLink = undefined
    pax = new Map()
  }
}

/** Every entry of an archive in memory, in order, with its data; `maxBytes` bounds what one entry may hold. */
export function* readTar(archive: Buffer, maxBytes = Number.POSITIVE_INFINITY): Generator<TarEntry> {
  for (const {size, dataAt, ...entry} of tarEntries(bufferSource(archive), maxBytes))
    yield {...entry, data: archive.subarray(dataAt, dataAt + size)}
}
