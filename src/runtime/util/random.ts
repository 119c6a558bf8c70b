/**
 * `bytes` random bytes from the system's CSPRNG, as hex. Through Web Crypto's global, which Node
 * loads on first use: importing node:crypto costs every start of a module that imports it ≈ 3 ms,
 * though most (a workspace that exists, a sandbox exec) never ask for a random name.
 */
export function randomHex(bytes: number): string {
  return Buffer.from(globalThis.crypto.getRandomValues(new Uint8Array(bytes))).toString('hex')
}
