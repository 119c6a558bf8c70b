import fs from 'node:fs'
import path from 'node:path'
import type {DockerCli, DockerExec} from '../../sandbox/docker/cli.js'
import type {EngineApi} from '../../sandbox/docker/engine-api.js'
import type {ImageContext} from '../../sandbox/docker/images.js'
import {APP_ROOT} from '../util/app-root.js'

let version: string | undefined

/** The installed app's version (package.json): part of every isolation image tag. */
export function appVersion(): string {
  version ??=
    (JSON.parse(fs.readFileSync(path.join(APP_ROOT, 'package.json'), 'utf8')) as {version?: string}).version ?? '0.0.0'
  return version
}

/** The process-wide docker CLI, loaded when first needed: a status asked over the Engine API never loads it. */
export async function loadDockerCli(): Promise<DockerCli> {
  return (await import('../../sandbox/docker/cli.js')).dockerCli()
}

const dockerCliOnFirstUse: DockerExec = {exec: async (args, options) => (await loadDockerCli()).exec(args, options)}

/**
 * What the image pipeline needs from this installation: the docker CLI (and the Engine API, when
 * given, for reads), this Node and this app as the runtime to bundle, and a cache dir in the
 * gateway home. One place, so the runner and the `container` commands always agree on which
 * images an agent uses.
 */
export function containerImageContext(
  home: string,
  options: {cli?: DockerCli; engine?: EngineApi; signal?: AbortSignal; onLog?: (line: string) => void} = {},
): ImageContext {
  return {
    cli: options.cli ?? dockerCliOnFirstUse,
    engine: options.engine,
    app: {appRoot: APP_ROOT, nodePath: process.execPath},
    version: appVersion(),
    cacheDir: path.join(home, 'cache'),
    signal: options.signal,
    onLog: options.onLog,
    buildNetwork: process.env.MEEPAGATEWAY_DOCKER_BUILD_NETWORK || 'host',
  }
}
