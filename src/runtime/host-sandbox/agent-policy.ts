import os from 'node:os'
import path from 'node:path'
import type {AgentConfig, GatewayConfig} from '../config/types.js'
import {APP_ROOT} from '../util/app-root.js'
import {listWorkspaceIds, workspacePath} from '../workspace/location.js'
import {compilePolicy, type SandboxPolicy} from '../../sandbox/policy.js'

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

/** PATH inside the sandbox: the system directories plus the directory of the Node that runs agent-run. */
export function sandboxPath(): string {
  const dirs = ['/usr/local/sbin', '/usr/local/bin', '/usr/sbin', '/usr/bin', '/sbin', '/bin']
  const nodeDir = path.dirname(process.execPath)
  return (dirs.includes(nodeDir) ? dirs : [nodeDir, ...dirs]).join(':')
}
