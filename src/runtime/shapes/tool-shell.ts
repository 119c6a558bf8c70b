/**
 * agent-run's shell tool, inside the host sandbox, starts each command through the helper again:
 *  - `--new-group`: the command gets a process group of its own (setsid is denied in the sandbox,
 *    so Node's `detached` cannot do it), and the tool's timeout can kill exactly that group;
 *  - `--deny-listen` with `allow_listen: false` in a container (on the host the outer layer already
 *    forbids listening for everything beneath it): no TCP/UDP bind, no listen().
 * The network needs no layer of its own: with `allow_network: false` the outer policy already
 * takes it from agent-run and everything it starts (agent-run reaches its LLM through its runner).
 * The runners tell agent-run through these variables.
 */
export const SANDBOX_HELPER_ENV = 'MEEPA_SANDBOX_HELPER'
export const SANDBOX_LISTEN_ENV = 'MEEPA_SANDBOX_LISTEN'

/** argv for a shell tool command: `/bin/sh -c COMMAND`, through the helper when inside the host sandbox. */
export function shellArgv(command: string, env: NodeJS.ProcessEnv): string[] {
  const helper = env[SANDBOX_HELPER_ENV]
  if (!helper) return ['/bin/sh', '-c', command]
  return [
    helper,
    '--new-group',
    ...(env[SANDBOX_LISTEN_ENV] === 'deny' ? ['--deny-listen'] : []),
    '--',
    '/bin/sh',
    '-c',
    command,
  ]
}
