import {failureFromError} from '../agent-run/output.js'
import {reclaimWorkspace} from '../workspace/owner.js'
import {agentRunArgv, runAgentProcess, type AgentProcessLaunch} from '../run-lifecycle/agent-run-process.js'
import {agentEnvironment, removePrivateTmp, withPrivateTmp} from '../run-lifecycle/private-tmp.js'
import {prepareStandbyAgentRun, takeStandbyAgentRun} from './standby-agent-runs.js'
import type {RunRequest, Runner} from './types.js'

/**
 * No isolation: agent-run as a plain child process, still with a scrubbed env, its limits and a
 * keeper that kills everything it started when it ends, at the deadline or when its owner dies.
 * In a running gateway (request.standby) the agent's next agent-run is started once a run ends.
 */
export const unrestrictedRunner: Runner = {
  level: 'unrestricted',
  run: async (request: RunRequest) => {
    const slot = `${request.home}\0${request.input.agent.id}`
    // what a standby must have been started with to serve this request (the rest is this process's)
    const key = JSON.stringify([request.input.workspace, request.input.agent.limits])
    const launchFor = (tmpDir: string, processId: string): AgentProcessLaunch => ({
      argv: agentRunArgv(),
      env: agentEnvironment(request.input.workspace, tmpDir),
      cwd: request.input.workspace,
      quietUntilInput: true,
      ownership: {
        home: request.home,
        runId: processId,
        limits: request.input.agent.limits,
        workspace: request.input.workspace,
        tmpDir,
      },
    })
    const run = {
      input: request.input,
      llm: request.llm,
      timeoutMs: request.timeoutMs,
      signal: request.signal,
      onStderr: request.onLog,
      onStarted: request.onStarted,
    }
    const ahead =
      typeof request.standby === 'object'
        ? request.standby
        : request.standby
          ? {wanted: () => true, log: (line: string) => request.onLog?.(line)}
          : undefined
    try {
      // root's files in a container's workspace would stay root's past the next container run's check (owner.ts)
      await reclaimWorkspace(request.input.workspace, request.signal)
    } catch (error) {
      return failureFromError(request.input.run_id, error)
    }
    const standby = ahead ? takeStandbyAgentRun(slot, key) : undefined
    try {
      if (!standby)
        return await withPrivateTmp(
          request.input.run_id,
          (tmp) => runAgentProcess({...launchFor(tmp, request.input.run_id), ...run}),
          request.onLog,
        )
      try {
        return await standby.process.run(run)
      } finally {
        await removePrivateTmp(standby.tmpDir, request.onLog)
      }
    } finally {
      // once the reply is on its way; never once the gateway is stopping
      if (ahead)
        setImmediate(
          () =>
            ahead.wanted() &&
            prepareStandbyAgentRun(slot, key, launchFor, (line) =>
              ahead.log(`standby agent-run of agent ${request.input.agent.id}: ${line}`),
            ),
        )
    }
  },
}
