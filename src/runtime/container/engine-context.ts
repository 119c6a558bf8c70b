import {spawnSync} from 'node:child_process'
import path from 'node:path'
import {DockerCli} from '../../sandbox/docker/cli.js'
import type {EngineConfig} from '../config/types.js'
import {GatewayError} from '../util/errors.js'

/** What `docker context inspect --format '{{json .}}'` says of a context (the fields read here). */
interface ContextRecord {
  Endpoints?: {docker?: {Host?: string; SkipTLSVerify?: boolean}}
  TLSMaterial?: {docker?: string[]}
  Storage?: {TLSPath?: string}
}

/**
 * The engine a `context:` names, as if its host and TLS files were written in the config: read
 * once with `docker context inspect` (the docker CLI's own store, DOCKER_CONFIG or ~/.docker),
 * then held to the same rules as a written host. A context that skips TLS verification, or whose
 * tcp:// has no TLS (without `insecure: true`), is refused; a unix:// one is this machine's.
 */
export function resolveContext(engine: EngineConfig, cli: DockerCli = new DockerCli()): EngineConfig {
  const name = engine.context as string
  const at = `engines[].context ${name} (engine ${engine.name})`
  const inspected = spawnSync(cli.bin, ['context', 'inspect', name, '--format', '{{json .}}'], {
    env: cli.env(),
    encoding: 'utf8',
    timeout: 10_000,
  })
  if (inspected.error || inspected.status !== 0)
    throw new GatewayError(
      'E_CONFIG',
      `${at}: docker context inspect failed: ${(inspected.stderr || String(inspected.error ?? '')).trim().split('\n')[0]}`,
      {
        suggestions: [
          'create it (docker context create NAME --docker host=…), or check DOCKER_CONFIG; docker context ls lists them',
        ],
      },
    )
  const record = JSON.parse(inspected.stdout) as ContextRecord
  const endpoint = record.Endpoints?.docker
  if (!endpoint?.Host) throw new GatewayError('E_CONFIG', `${at}: the context names no docker host`)
  if (endpoint.SkipTLSVerify)
    throw new GatewayError(
      'E_CONFIG',
      `${at}: the context skips TLS verification, so any server could pose as the engine`,
      {
        suggestions: ['recreate it with ca=, cert= and key= and without skip-tls-verify'],
      },
    )
  const material = record.TLSMaterial?.docker ?? []
  const host = endpoint.Host
  const {context: _context, ...written} = engine
  if (material.length === 0) {
    if (host.startsWith('tcp://') && !engine.insecure)
      throw new GatewayError(
        'E_CONFIG',
        `${at}: ${host} without TLS lets anyone who reaches the port run anything there`,
        {
          suggestions: [
            'recreate the context with ca=, cert= and key= (mutual TLS), or set insecure: true on the engine to accept that',
          ],
        },
      )
    return {...written, host}
  }
  const files = ['ca.pem', 'cert.pem', 'key.pem']
  if (!files.every((file) => material.includes(file)) || !record.Storage?.TLSPath)
    throw new GatewayError(
      'E_CONFIG',
      `${at}: the context's TLS lacks ${files.filter((file) => !material.includes(file)).join(', ') || 'its files'}`,
      {
        suggestions: ['mutual TLS needs ca=, cert= and key= in docker context create --docker'],
      },
    )
  const dir = path.join(record.Storage.TLSPath, 'docker')
  return {
    ...written,
    host,
    tls: {ca: path.join(dir, 'ca.pem'), cert: path.join(dir, 'cert.pem'), key: path.join(dir, 'key.pem')},
  }
}
