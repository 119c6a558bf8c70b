import {setMaxListeners} from 'node:events'

/**
 * An AbortController whose signal a long-lived owner hands to every call it starts (standby
 * preparations, owed container removals, waiting reply lanes, engine probes). Each child process
 * listens with two handlers, so a dozen at once is normal there, not the leak Node warns of at 11.
 */
export function sharedAbortController(): AbortController {
  const controller = new AbortController()
  setMaxListeners(0, controller.signal)
  return controller
}
