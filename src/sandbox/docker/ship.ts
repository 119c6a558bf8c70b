import {spawn, type ChildProcess} from 'node:child_process'
import {pipeline} from 'node:stream/promises'
import type {DockerCli} from './cli.js'
import {validateImageRef} from './dockerfile.js'
import {GatewayError} from '../../runtime/util/errors.js'

/** A shipped image may be large; over a slow link it still must end some time. */
const SHIP_TIMEOUT_MS = 60 * 60_000

/**
 * Copies images from one engine to another without a registry: `docker save` on the first piped
 * straight into `docker load` on the second (over its own connection), so the image is never
 * written whole to a file here.
 */
export async function shipImages(from: DockerCli, to: DockerCli, refs: string[], signal?: AbortSignal): Promise<void> {
  for (const ref of refs) validateImageRef(ref, 'image') // a reference is never a flag
  const abort = AbortSignal.any([AbortSignal.timeout(SHIP_TIMEOUT_MS), ...(signal ? [signal] : [])])
  const save = start(from, ['save', ...refs], abort)
  save.child.stdin!.end()
  const load = start(to, ['load', '--quiet'], abort)
  const [saved, loaded] = await Promise.allSettled([
    pipeline(save.child.stdout!, load.child.stdin!),
    save.exited,
    load.exited,
  ]).then((results) => [results[1], results[2]])
  const failed = [
    ['docker save', save, saved],
    ['docker load', load, loaded],
  ] as const
  for (const [what, call, result] of failed) {
    if (result?.status === 'fulfilled' && result.value === 0) continue
    throw new GatewayError(
      'E_IMAGE',
      `shipping ${refs.join(', ')} failed: ${what} ${abort.aborted ? 'was stopped' : `ended with ${result?.status === 'fulfilled' ? `exit ${result.value}` : 'an error'}`}: ${call.stderr().trim().split('\n').slice(-2).join(' | ')}`,
      {suggestions: ['check that both engines answer (`container status`), or build on the engine instead']},
    )
  }
}

function start(
  cli: DockerCli,
  args: string[],
  signal: AbortSignal,
): {child: ChildProcess; exited: Promise<number>; stderr: () => string} {
  const child = spawn(cli.bin, [...cli.engineArgs, ...args], {
    env: cli.env(),
    stdio: ['pipe', 'pipe', 'pipe'],
    signal,
    killSignal: 'SIGKILL',
  })
  let stderr = ''
  child.stderr!.on('data', (chunk: Buffer) => (stderr = (stderr + chunk.toString('utf8')).slice(-4000)))
  const exited = new Promise<number>((resolve, reject) => {
    child.once('error', reject)
    child.once('close', (code) => resolve(code ?? -1))
  })
  return {child, exited, stderr: () => stderr}
}
