/**
 * agent-run's shell tool, inside the host sandbox, starts each command through the helper again
 * with `--new-group`: the command gets a process group of its own (setsid is denied in the
 * sandbox, so Node's `detached` cannot do it), and the tool's timeout can kill exactly that group.
 * The network needs no layer of its own: with `allow_network: false` the outer policy already
 * takes it from agent-run and everything it starts (agent-run reaches its LLM through its runner).
 * The host-sandbox runner tells agent-run where the helper is through this variable.
 */
export const SANDBOX_HELPER_ENV = 'MEEPA_SANDBOX_HELPER'

/** argv for a shell tool command: `/bin/sh -c COMMAND`, through the helper when inside the host sandbox. */
export function shellArgv(command: string, env: NodeJS.ProcessEnv): string[] {
  const helper = env[SANDBOX_HELPER_ENV]
  if (!helper) return ['/bin/sh', '-c', command]
  return [helper, '--new-group', '--', '/bin/sh', '-c', command]
}
