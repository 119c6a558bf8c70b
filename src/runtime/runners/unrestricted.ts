import {failureFromError} from '../agent-run/output.js'
import {reclaimWorkspace} from '../run-lifecycle/workspace-owner.js'
import {agentRunArgv} from '../run-lifecycle/agent-run-process.js'
import {agentEnvironment} from '../run-lifecycle/private-tmp.js'
import {runInStandbyOrCold} from './standby-agent-runs.js'
import type {RunRequest, Runner} from './types.js'

/**
 * No isolation: agent-run as a plain child process, still with a scrubbed env, its limits and a
 * keeper that kills everything it started when it ends, at the deadline or when its owner dies.
 * In a running gateway (request.standby) the agent's next agent-run is started once a run ends.
 */
export const unrestrictedRunner: Runner = {
  level: 'unrestricted',
  run: (request: RunRequest) =>
    runInStandbyOrCold(request, 'unrestricted', async (tmpDir, processId, {signal}) => {
      try {
        // root's files in a container's workspace would stay root's past the next container run's check (owner.ts)
        await reclaimWorkspace(request.input.workspace, signal)
      } catch (error) {
        return failureFromError(request.input.run_id, error)
      }
      const launch = {
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
      }
      return {
        launch,
        shape: {"the agent's config": request.input.agent, 'the launch': {...launch, ownership: undefined}},
      }
    }),
}
