/**
 * SHA-256 as node:crypto computes it, without loading node:crypto for small inputs: its first
 * load costs a start ≈ 2 ms, more than hashing the few hundred bytes a light command hashes (a
 * home's label, a Dockerfile, the app's version line) in JavaScript. Past SMALL bytes the input
 * goes to node:crypto. For identifiers and cache keys; secrets are hashed with node:crypto.
 */

/** Above this many bytes node:crypto is faster than loading it is slow. */
const SMALL = 4096

export interface Sha256 {
  update(data: string | Uint8Array): Sha256
  digest(encoding: 'hex'): string
}

export function sha256(data: string | Uint8Array): string {
  return sha256Hash().update(data).digest('hex')
}

export function sha256Hash(): Sha256 {
  let chunks: Buffer[] = []
  let length = 0
  let native: ReturnType<typeof import('node:crypto').createHash> | undefined
  let digested = false
  const finalized = () => new Error('sha256: digest() was already called') // as node:crypto refuses it
  const hash: Sha256 = {
    update(data) {
      if (digested) throw finalized()
      if (native) {
        native.update(data)
        return hash
      }
      // a copy, read now as node:crypto reads it (a string as UTF-8): the caller may reuse its buffer
      const bytes = typeof data === 'string' ? Buffer.from(data, 'utf8') : Buffer.copyBytesFrom(data)
      chunks.push(bytes)
      length += bytes.length
      if (length > SMALL) {
        native = process.getBuiltinModule('node:crypto').createHash('sha256')
        for (const chunk of chunks) native.update(chunk)
        chunks = []
      }
      return hash
    },
    digest() {
      if (digested) throw finalized()
      digested = true
      return native ? native.digest('hex') : sha256Small(Buffer.concat(chunks, length))
    },
  }
  return hash
}

// FIPS 180-4: the first 32 bits of the fractional parts of the cube roots of the first 64 primes
const K = new Uint32Array([
  0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5, 0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3,
  0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174, 0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
  0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967, 0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13,
  0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85, 0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
  0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3, 0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208,
  0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2,
])

const rotr = (x: number, n: number) => (x >>> n) | (x << (32 - n))

function sha256Small(input: Buffer): string {
  // FIPS 180-4, 5.3.3: the first 32 bits of the fractional parts of the square roots of the first 8 primes
  const state = new Uint32Array([0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19])
  // 5.1.1: a 1 bit, zeros, and the length in bits as 64 bits, to a multiple of 64 bytes
  const padded = Buffer.alloc((((input.length + 8) >> 6) + 1) << 6)
  input.copy(padded)
  padded[input.length] = 0x80
  padded.writeUInt32BE(Math.floor(input.length / 0x20000000), padded.length - 8)
  padded.writeUInt32BE((input.length * 8) >>> 0, padded.length - 4)
  const w = new Uint32Array(64)
  for (let block = 0; block < padded.length; block += 64) {
    for (let t = 0; t < 16; t++) w[t] = padded.readUInt32BE(block + t * 4)
    for (let t = 16; t < 64; t++) {
      const w15 = w[t - 15] as number
      const w2 = w[t - 2] as number
      const s0 = rotr(w15, 7) ^ rotr(w15, 18) ^ (w15 >>> 3)
      const s1 = rotr(w2, 17) ^ rotr(w2, 19) ^ (w2 >>> 10)
      w[t] = (w[t - 16] as number) + s0 + (w[t - 7] as number) + s1
    }
    let a = state[0] as number
    let b = state[1] as number
    let c = state[2] as number
    let d = state[3] as number
    let e = state[4] as number
    let f = state[5] as number
    let g = state[6] as number
    let h = state[7] as number
    for (let t = 0; t < 64; t++) {
      const t1 = (h + (rotr(e, 6) ^ rotr(e, 11) ^ rotr(e, 25)) + ((e & f) ^ (~e & g)) + (K[t] as number) + (w[t] as number)) | 0
      const t2 = ((rotr(a, 2) ^ rotr(a, 13) ^ rotr(a, 22)) + ((a & b) ^ (a & c) ^ (b & c))) | 0
      h = g
      g = f
      f = e
      e = (d + t1) | 0
      d = c
      c = b
      b = a
      a = (t1 + t2) | 0
    }
    state[0] += a
    state[1] += b
    state[2] += c
    state[3] += d
    state[4] += e
    state[5] += f
    state[6] += g
    state[7] += h
  }
  const digest = Buffer.alloc(32)
  for (let i = 0; i < 8; i++) digest.writeUInt32BE(state[i] as number, i * 4)
  return digest.toString('hex')
}
