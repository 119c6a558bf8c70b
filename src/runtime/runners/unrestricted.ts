import {agentRunArgv, runAgentProcess} from './agent-run-process.js'
import {agentEnvironment, withPrivateTmp} from './private-tmp.js'
import type {RunRequest, Runner} from './types.js'

/**
 * No isolation: agent-run as a plain child process, still with a scrubbed env, its limits and a
 * keeper that kills everything it started when it ends, at the deadline or when its owner dies.
 */
export const unrestrictedRunner: Runner = {
  level: 'unrestricted',
  run: (request: RunRequest) =>
    withPrivateTmp(request.input.run_id, (tmp) =>
      runAgentProcess({
        argv: agentRunArgv(),
        env: agentEnvironment(request.workspace, tmp),
        cwd: request.workspace,
        input: request.input,
        llm: request.llm,
        timeoutMs: request.timeoutMs,
        signal: request.signal,
        onStderr: request.onLog,
        onStarted: request.onStarted,
        quietUntilInput: true,
        ownership: {home: request.home, runId: request.input.run_id, limits: request.agent.limits, workspace: request.workspace, tmpDir: tmp},
      }),
    ),
}
