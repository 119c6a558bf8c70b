import fs from 'node:fs'
import os from 'node:os'
import path from 'node:path'
import type {AgentConfig, GatewayConfig} from '../config/types.js'
import {APP_ROOT} from '../util/app-root.js'
import {listWorkspaceIds, workspacePath} from '../workspace/location.js'
import {isWithin} from '../../sandbox/paths.js'
import {compilePolicy, configDeniedPaths, type SandboxPolicy} from '../../sandbox/policy.js'

export interface AgentPolicyContext {
  agent: AgentConfig
  config: GatewayConfig
  /** MEEPAGATEWAY_HOME */
  home: string
  workspace: string
  tmpDir: string
  configPath?: string
  /** The operator's home (dotfiles denied); defaults to os.homedir(). */
  operatorHome?: string
  /** The run starts inside bubblewrap's namespaces (see src/sandbox/bwrap/namespaces.ts). */
  namespaces?: boolean
}

/** The host-sandbox policy of one agent for one run, with the real machine's baseline. */
export function agentPolicy(context: AgentPolicyContext): SandboxPolicy {
  const others = new Set([...context.config.agents.map((agent) => agent.id), ...listWorkspaceIds(context.home)])
  others.delete(context.agent.id)
  return compilePolicy({
    fileAccess: context.agent.file_access,
    workspace: context.workspace,
    tmpDir: context.tmpDir,
    gatewayHome: context.home,
    configPath: context.configPath,
    operatorHome: context.operatorHome ?? os.homedir(),
    otherWorkspaces: [...others].map((id) => workspacePath(context.home, id)),
    appRoot: APP_ROOT,
    nodeBinary: process.execPath,
    namespaces: context.namespaces,
  })
}

/**
 * Whether the agent's own `file_access.deny` covers a canonical path in its workspace: the gateway
 * reads no such file for it (send_file), whatever its level. By name, and by the identity (device
 * and inode) of each entry on the way up to the workspace, so that another spelling of a denied
 * folder (a case-insensitive file system, a bind mount) is covered too.
 */
export function deniedToAgent(
  agent: AgentConfig,
  workspace: string,
  operatorHome = os.homedir(),
): (file: string) => boolean {
  if (agent.file_access.deny.length === 0) return () => false
  // worked out at the first file asked for, once: a reply that sends none pays nothing
  let denies: {paths: string[]; identities: Set<string>; root: string} | undefined
  return (file) => {
    if (!denies) {
      const paths = configDeniedPaths(agent.file_access.deny, workspace, operatorHome)
      denies = {paths, identities: new Set(paths.map(identityOf).filter(Boolean)), root: fs.realpathSync(workspace)}
    }
    const {paths, identities, root} = denies
    if (paths.some((deny) => isWithin(file, deny))) return true
    for (let entry = file; isWithin(entry, root) && entry !== root; entry = path.dirname(entry))
      if (identities.has(identityOf(entry))) return true
    return false
  }
}

function identityOf(entry: string): string {
  const stat = fs.lstatSync(entry, {throwIfNoEntry: false})
  return stat ? `${stat.dev}:${stat.ino}` : ''
}

/** PATH inside the sandbox: the system directories plus the directory of the Node that runs agent-run. */
export function sandboxPath(): string {
  const dirs = ['/usr/local/sbin', '/usr/local/bin', '/usr/sbin', '/usr/bin', '/sbin', '/bin']
  const nodeDir = path.dirname(process.execPath)
  return (dirs.includes(nodeDir) ? dirs : [nodeDir, ...dirs]).join(':')
}
