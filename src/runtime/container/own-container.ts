/**
 * `docker run` argv of a short container of the gateway's own: its script on the agent's image,
 * never the agent's code. No network, read-only root, every capability dropped but `caps`, no new
 * privileges, few processes and little memory.
 */
export function ownContainerArgs(options: {
  image: string
  user: string
  labels: Record<string, string>
  /** `-v` specifications. */
  volumes: string[]
  caps?: string[]
  /** Its stdin open (a tar goes in). */
  stdin?: boolean
  /** More flags: device rules, a tmpfs. */
  extra?: string[]
}): string[] {
  return [
    'run',
    '--rm',
    ...(options.stdin ? ['-i'] : []),
    '--pull',
    'never',
    '--log-driver',
    'none',
    '--network',
    'none',
    '--read-only',
    '--cap-drop=ALL',
    ...(options.caps ?? []).map((cap) => `--cap-add=${cap}`),
    '--security-opt=no-new-privileges',
    '--pids-limit',
    '64',
    '--memory',
    '256m',
    '--user',
    options.user,
    ...Object.entries(options.labels).flatMap(([key, value]) => ['--label', `${key}=${value}`]),
    ...options.volumes.flatMap((volume) => ['-v', volume]),
    ...(options.extra ?? []),
    '--entrypoint',
    '/bin/sh',
    options.image,
  ]
}
