import type {AgentRunSuccess} from '../../src/runtime/shapes/agent-run-contract.js'

/** A finished run's output as agent-run writes it: one answer, no tools, no cost. */
export function successfulOutput(runId: string, content: string): AgentRunSuccess {
  return {
    version: 1,
    ok: true,
    run_id: runId,
    reply: {content},
    stop_reason: 'final',
    iterations: 1,
    tool_calls: [],
    usage: {input_tokens: 1, output_tokens: 1},
    ms: 1,
  }
}
