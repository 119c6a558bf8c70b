import fs from 'node:fs'
import {APP_ROOT} from '../../runtime/util/app-root.js'
import {GatewayError} from '../../runtime/util/errors.js'
import {startSubprocess} from '../../runtime/util/subprocess.js'
import {helperPath} from './helper-path.js'

/** Exit status of the helper when it refused or failed to set the sandbox up (nothing ran). */
export const HELPER_SETUP_EXIT = 125

export interface KernelProbe {
  landlock: {abi: number; errno?: string; reason?: string}
  seccomp: boolean
  arch: string
}

export function requireHelper(appRoot: string = APP_ROOT): string {
  const helper = helperPath(appRoot)
  try {
    fs.accessSync(helper, fs.constants.X_OK)
  } catch {
    throw new GatewayError('E_SANDBOX', `the host sandbox helper is missing: ${helper}`, {
      suggestions: ['build it with `npm run build:native` (needs a C compiler: apt-get install gcc)', 'or run the agent in container mode'],
    })
  }
  return helper
}

let cached: Promise<KernelProbe> | undefined

/** What the running kernel can enforce; asked once per process (the kernel does not change under us). */
export function probeKernel(helper: string = requireHelper()): Promise<KernelProbe> {
  cached ??= Promise.resolve(startSubprocess(helper, ['--probe'], {env: {}, timeoutMs: 10_000, forceKillAfterMs: 5_000}))
    .then((result) => {
      if (result.failed) throw new Error(`${result.message}${result.stderr ? `: ${result.stderr}` : ''}`)
      return JSON.parse(result.stdout) as KernelProbe
    })
    .catch((error: unknown) => {
      cached = undefined
      throw new GatewayError('E_SANDBOX', `the sandbox helper's kernel probe failed: ${(error as Error).message}`, {cause: error})
    })
  return cached
}
