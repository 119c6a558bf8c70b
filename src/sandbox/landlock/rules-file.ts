import {GatewayError} from '../../runtime/util/errors.js'
import type {SandboxPolicy} from '../policy.js'
import {namespaceRemounts} from '../bwrap/namespaces.js'

/**
 * The text the helper reads on its rules fd (format documented in native/meepa-sandbox.c).
 * `env` is the command's complete environment: nothing else is inherited through the helper.
 */
export function serializeRules(
  policy: Pick<SandboxPolicy, 'rules' | 'network' | 'listen' | 'bestEffort'> &
    Partial<Pick<SandboxPolicy, 'namespaces' | 'grants'>>,
  env: Record<string, string>,
): string {
  const lines = [
    'meepa-sandbox-rules 1',
    `best_effort ${policy.bestEffort ? 1 : 0}`,
    `network ${policy.network}`,
    `listen ${policy.listen}`,
  ]
  // inside bubblewrap's mount namespace only (namespaces.ts): outside it a remount would change the host's mounts
  if (policy.namespaces)
    for (const mount of namespaceRemounts({grants: policy.grants ?? []})) lines.push(`remount_ro ${mount}`)
  for (const rule of policy.rules) {
    assertOneLine(rule.path, `the path ${JSON.stringify(rule.path)}`)
    if (!rule.path.startsWith('/'))
      throw new GatewayError('E_INTERNAL', `sandbox rule path is not absolute: ${rule.path}`)
    lines.push(`path ${rule.rights.join(',')} ${rule.path}`)
  }
  for (const [name, value] of Object.entries(env)) {
    if (!/^[A-Za-z_][A-Za-z0-9_]*$/.test(name))
      throw new GatewayError('E_SANDBOX', `invalid environment variable name for the sandbox: ${name}`)
    assertOneLine(value, `the value of ${name}`)
    lines.push(`env ${name}=${value}`)
  }
  lines.push('end', '')
  return lines.join('\n')
}

function assertOneLine(text: string, what: string): void {
  if (/[\n\r\0]/.test(text)) {
    throw new GatewayError(
      'E_SANDBOX',
      `${what} contains a newline or NUL byte and cannot be passed to the sandbox helper`,
      {
        suggestions: ['rename the file or leave it out of file_access'],
      },
    )
  }
}
