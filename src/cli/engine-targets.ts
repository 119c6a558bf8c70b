import type {LoadedConfig} from '../runtime/config/types.js'
import type {EngineTarget} from '../runtime/container/per-engine.js'
import {escapeControls} from '../runtime/util/escape-controls.js'

/**
 * The engines a `container` command acts on one by one, or undefined without an `engines:` list
 * (the command then acts on the local engine as it always has). A name the config does not have
 * is refused, listing the configured ones. Loaded only when asked: most configs have no list.
 */
export async function engineTargets(
  loaded: LoadedConfig,
  name: string | undefined,
): Promise<EngineTarget[] | undefined> {
  if (!loaded.config.engines?.length && name === undefined) return undefined
  const selected = (await import('../runtime/runners/container/engines.js')).selectEngines(loaded.config, name)
  return loaded.config.engines?.length ? selected : undefined
}

/**
 * Prints an engine's own heading, or (exit 10) why it could not be asked (in its own words, control
 * characters escaped); true when it answered.
 */
export function engineAnswered(
  log: (line: string) => void,
  result: {name: string; error?: unknown},
  heading: string = `engine ${result.name}:`,
): boolean {
  if (typeof result.error !== 'string') {
    if (heading) log(heading)
    return true
  }
  log(`engine ${result.name}: not answering: ${escapeControls(result.error)}`)
  process.exitCode = 10
  return false
}
