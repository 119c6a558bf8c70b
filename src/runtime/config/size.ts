import {GatewayError} from '../util/errors.js'

const UNITS: Record<string, number> = {k: 1024, m: 1024 ** 2, g: 1024 ** 3}

/** `512m` / `2g` / `64k` (the schema's size form) in bytes; `field` names it in the error. */
export function sizeBytes(size: string, field: string): number {
  const match = /^([0-9]+)([kmg])$/.exec(size)
  if (!match) throw new GatewayError('E_CONFIG', `${field}: "${size}" must look like 512m or 2g`)
  return Number(match[1]) * (UNITS[match[2] as string] as number)
}
