import fs from 'node:fs'
import {APP_ROOT} from '../../runtime/util/app-root.js'
import {GatewayError} from '../../runtime/util/errors.js'
import {helperPath} from './helper-path.js'
import {recalled, remember} from '../../runtime/util/remembered.js'
import {bootId, fileIdentity, PROBE_RECORD} from '../probe-record.js'

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
      suggestions: [
        'build it with `npm run build:native` (needs a C compiler: apt-get install gcc)',
        'or run the agent in container mode',
      ],
    })
  }
  return helper
}

let cached: Promise<KernelProbe> | undefined

/**
 * What the running kernel can enforce; asked once per process (the kernel does not change under
 * us), and with `cacheFile` (in MEEPAGATEWAY_HOME) remembered for this boot and this helper binary.
 * A wrong record cannot weaken a run: the helper probes the kernel itself when it applies the
 * rules and refuses to run with a gap the policy does not accept.
 */
export function probeKernel(
  helper: string = requireHelper(),
  options: {cacheFile?: string} = {},
): Promise<KernelProbe> {
  cached ??= probeOrRecall(helper, options.cacheFile).catch((error: unknown) => {
    cached = undefined
    throw new GatewayError('E_SANDBOX', `the sandbox helper's kernel probe failed: ${(error as Error).message}`, {
      cause: error,
    })
  })
  return cached
}

async function probeOrRecall(helper: string, cacheFile: string | undefined): Promise<KernelProbe> {
  const identity = cacheFile ? fileIdentity(helper) : undefined
  const key = identity && JSON.stringify([helper, ...identity, bootId()])
  const known = cacheFile && key ? recalled<KernelProbe>(cacheFile, key, PROBE_RECORD) : undefined
  if (known && typeof known.landlock?.abi === 'number' && typeof known.seccomp === 'boolean') return known
  // imported only to probe (once per boot): a start that finds the record never loads execa
  const {startSubprocess} = await import('../../runtime/util/subprocess.js')
  const result = await startSubprocess(helper, ['--probe'], {env: {}, timeoutMs: 10_000, forceKillAfterMs: 5_000})
  if (result.failed) throw new Error(`${result.message}${result.stderr ? `: ${result.stderr}` : ''}`)
  const probe = JSON.parse(result.stdout) as KernelProbe
  if (cacheFile && key) remember(cacheFile, key, probe)
  return probe
}
