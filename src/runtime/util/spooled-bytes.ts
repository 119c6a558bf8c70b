import fs from 'node:fs'
import path from 'node:path'
import {makeDirectories} from './make-directories.js'
import {randomHex} from './random.js'

/** A run of bytes read by position: held in memory, or in a file (SpooledBytes). */
export interface ByteSource {
  readonly length: number
  /** Up to `size` bytes from `at` (fewer only past the end). */
  read(at: number, size: number): Buffer
  /** The same bytes from `at`, as a writer takes them: a Buffer, or a range of an open file. */
  content(at: number, size: number): Buffer | FileRange
  /** `length` bytes from `at`, as a source of their own. */
  slice(at: number, length: number): ByteSource
}

/** Bytes of an open file, read with positional reads (the file's offset is never used). */
export interface FileRange {
  fd: number
  at: number
  size: number
}

export function bufferSource(bytes: Buffer): ByteSource {
  return {
    length: bytes.length,
    read: (at, size) => bytes.subarray(at, at + size),
    content: (at, size) => bytes.subarray(at, at + size),
    slice: (at, length) => bufferSource(bytes.subarray(at, at + length)),
  }
}

function fileSource(fd: number, start: number, length: number, open: () => boolean): ByteSource {
  const readable = () => {
    // a descriptor closed since may be another file's by now
    if (!open()) throw new Error('the spooled bytes were freed')
    return fd
  }
  return {
    length,
    read(at, size) {
      const wanted = Math.max(0, Math.min(size, length - at))
      const bytes = Buffer.allocUnsafe(wanted)
      let got = 0
      while (got < wanted) {
        const read = fs.readSync(readable(), bytes, got, wanted - got, start + at + got)
        if (read === 0) break
        got += read
      }
      return bytes.subarray(0, got)
    },
    content: (at, size) => ({fd: readable(), at: start + at, size: Math.max(0, Math.min(size, length - at))}),
    slice: (at, sliceLength) => fileSource(fd, start + at, Math.max(0, Math.min(sliceLength, length - at)), open),
  }
}

/** Copies a file range to `fd` in pieces; the writer's loop for what is not in memory. */
export function copyFileRange(range: FileRange, fd: number): void {
  const piece = pieceFor(range)
  for (let done = 0; done < range.size;) done += copyPiece(range, fd, piece, done)
}

/** copyFileRange, waiting for `turn()` after each piece: the caller's event loop runs between them. */
export async function copyFileRangeInTurns(range: FileRange, fd: number, turn: () => Promise<void>): Promise<void> {
  const piece = pieceFor(range)
  for (let done = 0; done < range.size;) {
    done += copyPiece(range, fd, piece, done)
    await turn()
  }
}

const pieceFor = (range: FileRange) => Buffer.allocUnsafe(Math.min(COPY_PIECE_BYTES, Math.max(range.size, 1)))

/** One piece of the range from `done` on: how many bytes it copied. */
function copyPiece(range: FileRange, fd: number, piece: Buffer, done: number): number {
  const read = fs.readSync(range.fd, piece, 0, Math.min(piece.length, range.size - done), range.at + done)
  if (read === 0) throw new Error('the spooled bytes ended early')
  for (let written = 0; written < read;) written += fs.writeSync(fd, piece, written, read - written)
  return read
}

const COPY_PIECE_BYTES = 1 << 20

/**
 * Bytes arriving in pieces (a run's change tar from an engine, up to its limits.disk): held in
 * memory up to `inMemory` bytes, past that in a file of `dir` that is unlinked as soon as it is
 * made, so the bytes never sit in the gateway's memory whole and nothing is left behind if the
 * gateway dies. `close` frees them; reading after it is an error.
 */
export class SpooledBytes {
  length = 0
  /** What memory holds (its first `length` bytes), while there is no file. */
  private memory = Buffer.alloc(0)
  private fd: number | undefined
  private writing: Promise<void> = Promise.resolve()
  private failure: Error | undefined
  private closed = false

  constructor(
    private readonly dir: string,
    private readonly inMemory: number,
  ) {}

  /**
   * Takes the next piece: held in memory at once (undefined), or a promise that settles once it
   * is written; the pieces are written in order, so a caller may append again before it settles
   * (and pause its input).
   */
  append(piece: Buffer): Promise<void> | undefined {
    const at = this.length
    this.length += piece.length
    if (this.fd === undefined && this.length <= this.inMemory) {
      // one buffer, grown by doubling: a stream of one-byte pieces must not cost an object each
      if (this.length > this.memory.length) {
        const grown = Buffer.allocUnsafe(Math.min(this.inMemory, Math.max(this.length, this.memory.length * 2, 4096)))
        this.memory.copy(grown, 0, 0, at)
        this.memory = grown
      }
      piece.copy(this.memory, at)
      return undefined
    }
    this.writing = this.writing.then(() => {
      if (this.failure) throw this.failure
      if (this.fd === undefined) this.spill(at)
      return writeAt(this.fd!, piece, at)
    })
    this.writing.catch((error: unknown) => (this.failure ??= error as Error))
    return this.writing
  }

  /** Settles once every piece appended is held; rejects with the first failure to write one. */
  async whenHeld(): Promise<void> {
    await this.writing
  }

  /** What was appended so far, to read (call once every append has settled); reading after `close` throws. */
  source(): ByteSource {
    if (this.closed) throw new Error('the spooled bytes were freed')
    if (this.fd !== undefined) return fileSource(this.fd, 0, this.length, () => !this.closed)
    return bufferSource(this.memory.subarray(0, this.length))
  }

  /** Frees them (idempotent): the file's space goes with its descriptor. */
  close(): void {
    if (this.closed) return
    this.closed = true
    this.memory = Buffer.alloc(0)
    const fd = this.fd
    this.fd = undefined
    // after any write still queued: it must not land in a descriptor number reused meanwhile
    if (fd !== undefined) void this.writing.finally(() => fs.close(fd, () => {})).catch(() => {})
  }

  /** Moves what memory holds (its first `held` bytes) into a new unlinked file of `dir`. */
  private spill(held: number): void {
    if (this.closed) throw new Error('the spooled bytes were freed')
    makeDirectories(this.dir, 0o700)
    const file = path.join(this.dir, `spool-${randomHex(16)}`)
    const {O_RDWR, O_CREAT, O_EXCL, O_NOFOLLOW} = fs.constants
    const fd = fs.openSync(file, O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW, 0o600)
    try {
      fs.unlinkSync(file)
      for (let written = 0; written < held;) written += fs.writeSync(fd, this.memory, written, held - written, written)
    } catch (error) {
      fs.closeSync(fd)
      fs.rmSync(file, {force: true})
      throw error
    }
    this.fd = fd
    this.memory = Buffer.alloc(0)
  }
}

function writeAt(fd: number, bytes: Buffer, at: number): Promise<void> {
  return new Promise((resolve, reject) => {
    const next = (written: number) => {
      if (written >= bytes.length) return resolve()
      fs.write(fd, bytes, written, bytes.length - written, at + written, (error, count) =>
        error ? reject(error) : next(written + count),
      )
    }
    next(0)
  })
}
