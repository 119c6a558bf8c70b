/**
 * Shell commands inherit agent-run's environment minus anything that could carry a secret:
 * a variable named like a secret in the input, or whose value is one. Runners already start
 * agent-run with a scrubbed environment; this is the second fence for the unrestricted level.
 */
export function withoutSecrets(env: NodeJS.ProcessEnv, secrets: Record<string, string>): NodeJS.ProcessEnv {
  const values = new Set(Object.values(secrets).filter((value) => value.length >= 6))
  return Object.fromEntries(
    Object.entries(env).filter(([name, value]) => !(name in secrets) && !(value !== undefined && values.has(value))),
  )
}
