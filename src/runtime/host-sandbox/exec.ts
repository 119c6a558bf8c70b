import fs from 'node:fs'
import os from 'node:os'
import path from 'node:path'
import {agentPolicy, sandboxPath} from './agent-policy.js'
import {killProcessGroup, killProcessTree} from '../util/process-tree.js'
import type {Subprocess} from '../util/subprocess.js'
import {
  enforcementReport,
  kernelGaps,
  namespaceGaps,
  type EnforcementReport,
} from '../../sandbox/landlock/enforcement.js'
import {probeKernel, requireHelper, type KernelProbe} from '../../sandbox/landlock/helper.js'
import {sizeBytes} from '../config/size.js'
import {serializeRules} from '../../sandbox/landlock/rules-file.js'
import {bwrapArgv, probeNamespaces, rememberedLayerBroke, type NamespaceProbe} from '../../sandbox/bwrap/namespaces.js'
import {probeRecord} from '../util/paths.js'
import type {SandboxPolicy} from '../../sandbox/policy.js'
import {seatbeltInvocation, type SeatbeltInvocation} from '../../sandbox/seatbelt/profile.js'
import {findAgent} from '../config/load.js'
import type {AgentConfig, LoadedConfig} from '../config/types.js'
import {GatewayError} from '../util/errors.js'
import {agentEnvironment, removePrivateTmp} from '../run-lifecycle/private-tmp.js'
import {limitsReport, type LimitReport} from '../run-lifecycle/limits-report.js'
import {isolationLevelFor} from '../shapes/isolation-level.js'
import {ensureWorkspace, readyWorkspace} from '../workspace/workspace.js'
import {reclaimWorkspace} from '../run-lifecycle/workspace-owner.js'

/** One agent's sandbox for a command run by the operator: policy, helper, kernel facts, temp dir. */
export interface AgentSandbox {
  agent: AgentConfig
  workspace: string
  tmpDir: string
  policy: SandboxPolicy
  helper: string
  probe: KernelProbe
  namespaces: NamespaceProbe
  /** bwrap and its options when the namespace layer is used, else empty. */
  prefix: string[]
  /** The command's whole environment inside the sandbox. */
  env: Record<string, string>
  /** Removes the command's TMPDIR at any depth; never throws (a failure goes to `log`). */
  dispose(log?: (line: string) => void): Promise<void>
}

function requireLinux(): void {
  if (process.platform !== 'linux') {
    throw new GatewayError(
      'E_ISOLATION_UNAVAILABLE',
      `the Landlock host sandbox runs on Linux; this is ${process.platform}`,
      {
        suggestions:
          process.platform === 'darwin'
            ? ['on macOS the policy is compiled to a Seatbelt profile: see `sandbox explain --json`']
            : [],
      },
    )
  }
}

/** Compiles an agent's policy and checks, fail-closed, that this kernel can enforce it. */
export async function openAgentSandbox(
  loaded: LoadedConfig,
  agentId: string,
  options: {allowGaps?: boolean} = {},
): Promise<AgentSandbox> {
  requireLinux()
  const agent = findAgent(loaded, agentId)
  const helper = requireHelper()
  // the kernel probe is a process start: it runs while the policy is computed (the namespace
  // probe, which the policy depends on, is nearly always its remembered success)
  const kernel = probeKernel(helper, {cacheFile: probeRecord(loaded.home, 'kernel')})
  kernel.catch(() => {}) // awaited below
  const probingNamespaces = probeNamespaces({cacheFile: probeRecord(loaded.home, 'namespace')})
  const workspace = (await readyWorkspace(loaded.home, agent.id, agent.limits.disk)).path
  const tmpDir = fs.mkdtempSync(path.join(os.tmpdir(), `meepa-sandbox-${agent.id}-`))
  const dispose = (log?: (line: string) => void) => removePrivateTmp(tmpDir, log)
  try {
    const namespaces = await probingNamespaces
    const policy = agentPolicy({
      agent,
      config: loaded.config,
      home: loaded.home,
      workspace,
      tmpDir,
      configPath: loaded.path,
      namespaces: namespaces.available,
    })
    const probe = await kernel
    const gaps = [...kernelGaps(probe, policy.network, policy.listen), ...namespaceGaps(policy, namespaces)]
    if (gaps.length > 0 && !policy.bestEffort && !options.allowGaps) {
      throw new GatewayError('E_SANDBOX', `the host sandbox cannot be enforced on this machine: ${gaps.join('; ')}`, {
        suggestions: [
          'upgrade the kernel (Landlock ABI 6 = Linux 6.12)',
          ...(namespaceGaps(policy, namespaces).length > 0
            ? ['install bubblewrap (apt-get install bubblewrap) and allow unprivileged user namespaces']
            : []),
          'use container mode for this agent',
          'or set file_access.best_effort: true to run with these gaps',
        ],
        details: {gaps},
      })
    }
    const prefix = namespaces.available
      ? bwrapArgv(namespaces.bwrap!, policy, loaded.home, {
          path: tmpDir,
          bytes: sizeBytes(agent.limits.disk, 'limits.disk'),
        })
      : []
    const env: Record<string, string> = {...agentEnvironment(workspace, tmpDir), PATH: sandboxPath()}
    if (process.env.TERM) env.TERM = process.env.TERM
    return {agent, workspace, tmpDir, policy, helper, probe, namespaces, prefix, env, dispose}
  } catch (error) {
    await dispose()
    throw error
  }
}

export interface SandboxExecOptions {
  loaded: LoadedConfig
  agentId: string
  argv: string[]
  timeoutMs: number
  onLog?: (line: string) => void
  /** Called just before the command starts: an error after it comes after the command ran (or while it runs). */
  onStart?: () => void
}

/**
 * Starts argv under an agent's policy: the helper reads its rules on fd 3 and opens a session the
 * caller can kill whole. execa is imported here, when a command starts: `sandbox explain` and
 * `config check` never load it.
 */
export async function spawnInSandbox(
  sandbox: AgentSandbox,
  argv: string[],
  options: {stdio: 'inherit' | 'pipe'; timeoutMs: number},
): Promise<{child: Subprocess}> {
  const {startSubprocess} = await import('../util/subprocess.js')
  const [file, ...args] = [...sandbox.prefix, sandbox.helper, '--rules-fd', '3', '--', ...argv]
  const child = startSubprocess(file!, args, {
    cwd: sandbox.workspace,
    env: {},
    stdio: options.stdio === 'inherit' ? ['inherit', 'inherit', 'inherit', 'pipe'] : ['ignore', 'pipe', 'pipe', 'pipe'],
    detached: true,
    timeoutMs: options.timeoutMs,
    killSignal: 'SIGKILL',
  })
  ;(child.stdio[3] as NodeJS.WritableStream).end(serializeRules(sandbox.policy, sandbox.env))
  return {child} // not the child itself: it is a promise of its result, which `await` would wait for
}

/**
 * `sandbox exec`: runs any command under an agent's host policy with the terminal attached; returns
 * its exit status.
 */
export async function sandboxExec(options: SandboxExecOptions): Promise<{exitCode: number; timedOut: boolean}> {
  if (options.argv.length === 0)
    throw new GatewayError('E_USAGE', 'no command given after "--"', {
      suggestions: ['meepagateway sandbox exec --agent ID -- CMD [ARGS...]'],
    })
  const sandbox = await openAgentSandbox(options.loaded, options.agentId)
  try {
    await reclaimWorkspace(sandbox.workspace)
    if (sandbox.policy.bestEffort) {
      const gaps = [
        ...kernelGaps(sandbox.probe, sandbox.policy.network, sandbox.policy.listen),
        ...namespaceGaps(sandbox.policy, sandbox.namespaces),
      ]
      for (const gap of gaps) options.onLog?.(`sandbox: best effort, NOT enforced: ${gap}`)
    }
    options.onStart?.()
    const {child} = await spawnInSandbox(sandbox, options.argv, {stdio: 'inherit', timeoutMs: options.timeoutMs})
    // With the namespace layer the command lives in bwrap's PID namespace, which dies with bwrap
    // (its init gets SIGKILL with its parent): killing bwrap's group ends everything, and a scan of
    // /proc for bwrap's session (≈ 1 ms) would find nothing of it (the helper's session is inside).
    const killGroup = () => (sandbox.prefix.length > 0 ? killProcessGroup(child.pid) : killProcessTree(child.pid))
    const onSignal = () => killGroup()
    process.once('SIGINT', onSignal)
    process.once('SIGTERM', onSignal)
    const result = await child
    process.off('SIGINT', onSignal)
    process.off('SIGTERM', onSignal)
    killGroup() // whatever the command left running in the background
    if (result.timedOut) return {exitCode: 124, timedOut: true}
    // bwrap failed where a remembered probe said it works: the command never ran; once more, as the layer is now
    if (
      result.exitCode === 1 &&
      sandbox.prefix.length > 0 &&
      (await rememberedLayerBroke(sandbox.namespaces, probeRecord(options.loaded.home, 'namespace')))
    ) {
      options.onLog?.(
        'sandbox: bubblewrap no longer creates the namespaces here (its remembered probe was out of date); starting the command again without them',
      )
      await sandbox.dispose(options.onLog)
      return sandboxExec(options)
    }
    const signal = result.signal ? os.constants.signals[result.signal] : undefined
    return {exitCode: result.exitCode ?? (signal ? 128 + signal : 1), timedOut: false}
  } finally {
    await sandbox.dispose(options.onLog)
  }
}

export interface SandboxExplanation {
  agent: string
  workspace: string
  platform: NodeJS.Platform
  report?: EnforcementReport
  seatbelt?: SeatbeltInvocation
  /** Resource limits of the agent's runs at its level here (limits section), and how each is enforced. */
  limits: LimitReport[]
}

/** `sandbox explain`: the enforcement manifest of an agent's policy on this machine. */
export async function sandboxExplain(loaded: LoadedConfig, agentId: string): Promise<SandboxExplanation> {
  if (process.platform === 'darwin') {
    const agent = findAgent(loaded, agentId)
    const workspace = ensureWorkspace(loaded.home, agent.id).path
    const tmpDir = fs.mkdtempSync(path.join(os.tmpdir(), `meepa-sandbox-${agent.id}-`))
    try {
      const policy = agentPolicy({
        agent,
        config: loaded.config,
        home: loaded.home,
        workspace,
        tmpDir,
        configPath: loaded.path,
      })
      const seatbelt = seatbeltInvocation(policy, ['CMD'])
      return {
        agent: agent.id,
        workspace,
        platform: process.platform,
        seatbelt,
        limits: limitsReport(agent, isolationLevelFor(agent), loaded.config.engines),
      }
    } finally {
      fs.rmSync(tmpDir, {recursive: true, force: true})
    }
  }
  const sandbox = await openAgentSandbox(loaded, agentId, {allowGaps: true})
  try {
    return {
      agent: sandbox.agent.id,
      workspace: sandbox.workspace,
      platform: process.platform,
      report: enforcementReport(sandbox.policy, sandbox.probe, sandbox.namespaces),
      limits: limitsReport(sandbox.agent, isolationLevelFor(sandbox.agent), loaded.config.engines),
    }
  } finally {
    await sandbox.dispose()
  }
}
