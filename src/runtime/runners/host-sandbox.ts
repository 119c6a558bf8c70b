import type {AgentRunOutput} from '../shapes/agent-run-contract.js'
import {agentPolicy, sandboxPath} from '../host-sandbox/agent-policy.js'
import {kernelGaps, namespaceGaps} from '../../sandbox/landlock/enforcement.js'
import {HELPER_SETUP_EXIT, probeKernel, requireHelper} from '../../sandbox/landlock/helper.js'
import {serializeRules} from '../../sandbox/landlock/rules-file.js'
import {bwrapArgv, probeNamespaces, rememberedLayerBroke, type NamespaceProbe} from '../../sandbox/bwrap/namespaces.js'
import {probeRecord} from '../util/paths.js'
import {sizeBytes} from '../config/size.js'
import {SANDBOX_HELPER_ENV} from '../shapes/tool-shell.js'
import type {SandboxPolicy} from '../../sandbox/policy.js'
import {seatbeltInvocation} from '../../sandbox/seatbelt/profile.js'
import {prepareWorkspaceForPolicy} from '../host-sandbox/workspace-prep.js'
import {reclaimWorkspace} from '../run-lifecycle/workspace-owner.js'
import {failure, failureFromError} from '../agent-run/output.js'
import {agentRunArgv} from '../run-lifecycle/agent-run-process.js'
import {agentEnvironment} from '../run-lifecycle/private-tmp.js'
import {runInStandbyOrCold, type StandbyPlan} from './standby-agent-runs.js'
import type {RunRequest, Runner} from './types.js'

export interface Launch {
  argv: string[]
  env: Record<string, string>
  fd3?: string
  /** agent-run under the helper alone: nothing forks before its input (bwrap would, at once). */
  quietUntilInput?: boolean
}

/**
 * The default level (docs/isolation.md): agent-run and everything it starts run under the Landlock +
 * seccomp helper (Linux) or sandbox-exec (macOS). Fail closed: when the kernel cannot enforce the
 * policy the run is refused with what is missing, unless the agent opted into best effort (then
 * every gap is logged on every run).
 */
export const hostSandboxRunner: Runner = {
  level: 'host-sandbox',
  run: (request: RunRequest) => runHostSandboxed(request, MOUNT_RACE_RETRIES),
}

/** Starts after bwrap lost a race with the host's mounts before the run is refused. */
const MOUNT_RACE_RETRIES = 3

async function runHostSandboxed(request: RunRequest, mountRaceRetries: number): Promise<AgentRunOutput> {
  let namespaces: NamespaceProbe | undefined
  const output = await runInStandbyOrCold(request, 'host-sandbox', async (tmp, processId, context) => {
    const planned = await hostSandboxPlan(request, tmp, processId, context)
    if ('launch' in planned) namespaces = planned.namespaces
    return planned
  })
  // bwrap failed where a remembered probe said it works: agent-run never started; once more, as the layer is now
  if (
    namespaces &&
    bwrapFailed(output) &&
    (await rememberedLayerBroke(namespaces, probeRecord(request.home, 'namespace')))
  ) {
    request.onLog?.(
      'sandbox: bubblewrap no longer creates the namespaces here (its remembered probe was out of date); starting the run again without them',
    )
    return hostSandboxRunner.run(request)
  }
  if (mountRaceRetries > 0 && lostMountRace(output)) {
    request.onLog?.('sandbox: a host mount went away while bubblewrap set the run up (nothing ran); starting again')
    return runHostSandboxed(request, mountRaceRetries - 1)
  }
  return helperRefusal(output) ?? output
}

/**
 * bwrap lists the host's mounts, then binds and remounts each read-only: a mount gone in between
 * (a container of the engine ending, an unmount) fails the start before agent-run ran anything.
 */
function lostMountRace(output: AgentRunOutput): boolean {
  return (
    bwrapFailed(output) &&
    !output.ok &&
    /^bwrap: Can't (?:bind mount \/oldroot\/|remount readonly on \/newroot\/).*No such file or directory/m.test(
      String(output.error.details?.stderr_tail ?? ''),
    )
  )
}

/**
 * How one agent-run of the request's agent starts with private TMPDIR `tmp`, under the policy of
 * the config, the workspace and the host as they are now: for its message, or ahead of it for a
 * standby (the same plan: the shape compared at the message includes the policy, the bwrap
 * argv, the environment and the agent's config, so a standby serves only what a cold start would
 * have started).
 */
async function hostSandboxPlan(
  request: RunRequest,
  tmp: string,
  processId: string,
  context: {log?: (line: string) => void; signal?: AbortSignal},
): Promise<(StandbyPlan & {namespaces?: NamespaceProbe}) | AgentRunOutput> {
  const runId = request.input.run_id
  const {log} = context
  let launch: Launch
  let namespaces: NamespaceProbe | undefined
  try {
    await reclaimWorkspace(request.input.workspace, context.signal)
    namespaces =
      process.platform === 'linux'
        ? await probeNamespaces({cacheFile: probeRecord(request.home, 'namespace')})
        : undefined
    const compile = () =>
      agentPolicy({
        agent: request.input.agent,
        config: request.config,
        home: request.home,
        workspace: request.input.workspace,
        tmpDir: tmp,
        configPath: request.configPath,
        namespaces: namespaces?.available,
      })
    let policy = compile()
    if (prepareWorkspaceForPolicy(request.input.workspace, policy)) policy = compile()
    for (const note of policy.notes) log?.(`sandbox: ${note}`)
    const env = {...agentEnvironment(request.input.workspace, tmp), PATH: sandboxPath()}
    if (process.platform === 'darwin') launch = {argv: seatbeltInvocation(policy, agentRunArgv()).argv, env}
    else {
      const policyGaps = namespaceGaps(policy, namespaces)
      if (policy.bestEffort) for (const gap of policyGaps) log?.(`sandbox: best effort, NOT enforced: ${gap}`)
      const linux = await linuxLaunch(policy, env, {
        bwrap: namespaces?.available
          ? bwrapArgv(namespaces.bwrap!, policy, request.home, {
              path: tmp,
              bytes: sizeBytes(request.input.agent.limits.disk, 'limits.disk'),
            })
          : [],
        policyGaps,
        home: request.home,
      })
      if ('error' in linux) return failure(runId, 'E_SANDBOX', linux.error, false, {gaps: linux.gaps, fix: linux.fix})
      launch = linux
    }
  } catch (error) {
    return failureFromError(runId, error, 'E_SANDBOX')
  }
  return {
    launch: {
      ...launch,
      cwd: request.input.workspace,
      ownership: {
        home: request.home,
        runId: processId,
        limits: request.input.agent.limits,
        workspace: request.input.workspace,
        tmpDir: tmp,
      },
    },
    shape: {
      "the agent's config": request.input.agent,
      'the sandbox policy and launch (file_access, the workspace, the namespace and kernel probes, the environment)':
        launch,
    },
    privateTmpfs: Boolean(namespaces?.available),
    namespaces,
  }
}

/** agent-run's output when bwrap itself failed before starting anything (its messages start with "bwrap: "). */
function bwrapFailed(output: AgentRunOutput): boolean {
  return (
    !output.ok && output.error.code === 'E_RUN' && /^bwrap: /m.test(String(output.error.details?.stderr_tail ?? ''))
  )
}

/**
 * How the runner starts `command` (agent-run) under the helper, behind bubblewrap's namespaces when
 * given (with `home`, the kernel probe's record there is used); exported so tests can put a hostile
 * program in agent-run's place.
 */
export async function linuxLaunch(
  policy: SandboxPolicy,
  env: Record<string, string>,
  options: {bwrap?: string[]; policyGaps?: string[]; command?: string[]; home?: string} = {},
): Promise<Launch | {error: string; gaps: string[]; fix: string}> {
  const {bwrap = [], policyGaps = [], command = agentRunArgv()} = options
  const helper = requireHelper()
  const probe = await probeKernel(helper, {
    cacheFile: options.home === undefined ? undefined : probeRecord(options.home, 'kernel'),
  })
  const gaps = [...kernelGaps(probe, policy.network, policy.listen), ...policyGaps]
  if (gaps.length > 0 && !policy.bestEffort) {
    return {
      error: `the host sandbox cannot be enforced on this machine: ${gaps.join('; ')}`,
      gaps,
      fix: `${policyGaps.length > 0 ? 'install bubblewrap and allow unprivileged user namespaces, move the deny out of the writable tree, ' : ''}upgrade the kernel, use container mode, or set file_access.best_effort: true to run with these gaps`,
    }
  }
  // agent-run reaches its LLM through the runner (stdin/stdout), so with allow_network: false
  // the whole tree, agent-run included, is off the network.
  const inner = {...env, [SANDBOX_HELPER_ENV]: helper}
  return {
    argv: [...bwrap, helper, '--rules-fd', '3', '--', ...command],
    env: {},
    fd3: serializeRules(policy, inner),
    quietUntilInput: bwrap.length === 0 && options.command === undefined,
  }
}

/** The helper's own refusal (exit 125, nothing ran) reads better as E_SANDBOX than as a crashed run. */
function helperRefusal(output: AgentRunOutput): AgentRunOutput | undefined {
  if (output.ok || output.error.code !== 'E_RUN') return undefined
  const tail = String(output.error.details?.stderr_tail ?? '')
  const lines = tail.split('\n').filter((line) => line.startsWith('meepa-sandbox: '))
  if (lines.length === 0 || !output.error.message.includes(`code ${HELPER_SETUP_EXIT}`)) return undefined
  return failure(
    output.run_id,
    'E_SANDBOX',
    lines.map((line) => line.slice('meepa-sandbox: '.length)).join('; '),
    false,
    {stderr_tail: tail},
  )
}
