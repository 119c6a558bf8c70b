import os from 'node:os'
import path from 'node:path'

/** MEEPAGATEWAY_HOME, or ~/.meepagateway: config, gateway state and agent workspaces. */
export function gatewayHome(env: NodeJS.ProcessEnv = process.env): string {
  const fromEnv = env.MEEPAGATEWAY_HOME
  return path.resolve(fromEnv && fromEnv.trim() ? fromEnv : path.join(os.homedir(), '.meepagateway'))
}

export function defaultConfigPath(home: string): string {
  return path.join(home, 'config.yaml')
}

export function agentsDir(home: string): string {
  return path.join(home, 'agents')
}

export function gatewayDbPath(home: string): string {
  return path.join(home, 'gateway.db')
}

/**
 * A host probe's remembered answer (util/remembered.ts): bubblewrap's namespaces, the kernel's
 * Landlock and seccomp.
 */
export function probeRecord(home: string, probe: 'namespace' | 'kernel'): string {
  return path.join(home, 'cache', `${probe}-probe.json`)
}

/** The config's parsed YAML, remembered for its text (config/load.ts). */
export function configDocumentRecord(home: string): string {
  return path.join(home, 'cache', 'config-document.json')
}

/** The serving gateway's own directory (mode 0700): send's socket and token, where its HTTP listener is. */
export function gatewayRunDir(home: string): string {
  return path.join(home, 'run')
}

/** The gateway's copies of the files replies carry until they are delivered (state/outbox-spool.ts). */
export function outboxSpoolDir(home: string): string {
  return path.join(home, 'spool', 'outbox')
}

/** Where a run's changes from a sync engine wait while they are taken back, past what memory holds (util/spooled-bytes.ts). */
export function syncSpoolDir(home: string): string {
  return path.join(home, 'spool', 'sync')
}

/** What the host remembers of each agent's volume and disk image on each engine (container/engine-state.ts). */
export function engineSyncDir(home: string): string {
  return path.join(home, 'cache', 'engine-sync')
}

/** The random id that tells this home's objects on an engine from another's (sandbox/docker/home-label.ts). */
export function installIdFile(home: string): string {
  return path.join(home, 'install-id')
}
