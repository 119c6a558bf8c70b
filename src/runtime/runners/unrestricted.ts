import {agentRunArgv, runAgentProcess} from './agent-run-process.js'
import {agentEnvironment, withPrivateTmp} from './private-tmp.js'
import type {RunRequest, Runner} from './types.js'

/** No isolation: agent-run as a plain child process, still with a scrubbed env and a group kill at the deadline. */
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
      }),
    ),
}
