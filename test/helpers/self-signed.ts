import fs from 'node:fs'
import {execa} from 'execa'

/**
 * A self-signed EC certificate (openssl) for 127.0.0.1, or for a host `name`, written to `cert` and
 * `key` (PEM) unless `cert` exists already: a TLS server that no client trusts unless told to.
 */
export async function selfSignedCertificate(cert: string, key: string, name?: string): Promise<void> {
  if (fs.existsSync(cert)) return
  await execa('openssl', [
    'req',
    '-x509',
    '-newkey',
    'ec',
    '-pkeyopt',
    'ec_paramgen_curve:prime256v1',
    '-nodes',
    '-days',
    '1',
    '-subj',
    `/CN=${name ?? '127.0.0.1'}`,
    '-addext',
    name ? `subjectAltName=DNS:${name}` : 'subjectAltName=IP:127.0.0.1',
    '-keyout',
    key,
    '-out',
    cert,
  ])
}
