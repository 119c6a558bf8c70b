import fs from 'node:fs'

/**
 * What an executable needs from the machine it runs on: its CPU architecture (in Docker's
 * names) and its program interpreter, the dynamic loader that names the libc it was built
 * against (glibc: /lib64/ld-linux-x86-64.so.2, musl: /lib/ld-musl-x86_64.so.1). Copying the
 * host's Node into an image whose libc or architecture differs is what produces the
 * "exec format error" / "no such file or directory" users otherwise see at run time.
 */
export interface ElfRuntime {
  /** Docker's architecture name: amd64, arm64, arm, 386, ... (or `machine-<n>` when unknown). */
  arch: string
  /** The PT_INTERP path; undefined for a static executable. */
  interpreter?: string
  /** The libc family implied by the interpreter. */
  libc: 'glibc' | 'musl' | 'static' | 'unknown'
}

const MACHINES: Record<number, string> = {
  0x03: '386',
  0x28: 'arm',
  0x3e: 'amd64',
  0xb7: 'arm64',
  0x08: 'mips',
  0x15: 'ppc64',
  0x16: 's390x',
  0xf3: 'riscv64',
}
const PT_INTERP = 3

/** Parses the head of an ELF file; null when it is not ELF (e.g. a macOS Mach-O Node). */
export function parseElfRuntime(head: Buffer): ElfRuntime | null {
  if (head.length < 52 || head.readUInt32BE(0) !== 0x7f454c46) return null
  const is64 = head[4] === 2
  const le = head[5] === 1
  const u16 = (offset: number) => (le ? head.readUInt16LE(offset) : head.readUInt16BE(offset))
  const u32 = (offset: number) => (le ? head.readUInt32LE(offset) : head.readUInt32BE(offset))
  const word = (offset: number) =>
    is64 ? Number(le ? head.readBigUInt64LE(offset) : head.readBigUInt64BE(offset)) : u32(offset)

  const machine = u16(18)
  const arch = MACHINES[machine] ?? `machine-${machine}`
  const phoff = word(is64 ? 0x20 : 0x1c)
  const phentsize = u16(is64 ? 0x36 : 0x2a)
  const phnum = u16(is64 ? 0x38 : 0x2c)

  let interpreter: string | undefined
  for (let i = 0; i < phnum; i++) {
    const ph = phoff + i * phentsize
    if (ph + phentsize > head.length) break
    if (u32(ph) !== PT_INTERP) continue
    const offset = word(ph + (is64 ? 0x08 : 0x04))
    const size = word(ph + (is64 ? 0x20 : 0x10))
    if (offset + size <= head.length)
      interpreter = head
        .subarray(offset, offset + size)
        .toString('latin1')
        .replace(/\0+$/, '')
    break
  }
  return {arch, interpreter, libc: libcOf(interpreter)}
}

/** Reads enough of an executable to find its architecture and interpreter. */
export async function readElfRuntime(file: string): Promise<ElfRuntime | null> {
  const handle = await fs.promises.open(file, 'r')
  try {
    const head = Buffer.alloc(64 * 1024)
    const {bytesRead} = await handle.read(head, 0, head.length, 0)
    return parseElfRuntime(head.subarray(0, bytesRead))
  } finally {
    await handle.close()
  }
}

function libcOf(interpreter: string | undefined): ElfRuntime['libc'] {
  if (interpreter === undefined) return 'static'
  if (/ld-musl/.test(interpreter)) return 'musl'
  if (/ld-linux|ld64\.so|ld\.so/.test(interpreter)) return 'glibc'
  return 'unknown'
}

/** Docker's name for the architecture Node reports in process.arch. */
export function dockerArchOf(nodeArch: string): string {
  const names: Record<string, string> = {
    x64: 'amd64',
    arm64: 'arm64',
    arm: 'arm',
    ia32: '386',
    ppc64: 'ppc64',
    s390x: 's390x',
    riscv64: 'riscv64',
  }
  return names[nodeArch] ?? nodeArch
}
