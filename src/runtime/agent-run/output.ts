import {toGatewayError, type ErrorCode} from '../util/errors.js'
import type {AgentRunOutput} from '../shapes/agent-run-contract.js'

// Kept apart from the runners so agent-run can use these without loading execa at start-up.

export function failure(
  runId: string,
  code: ErrorCode,
  message: string,
  retryable = false,
  details?: Record<string, unknown>,
): AgentRunOutput {
  return {version: 1, ok: false, run_id: runId, error: {code, message, retryable, ...(details ? {details} : {})}}
}

/** E_OOM, from agent-run (a command it ran was killed) or the host (agent-run itself was). */
export function outOfMemory(runId: string, memoryLimit: string, details: Record<string, unknown> = {}): AgentRunOutput {
  return failure(
    runId,
    'E_OOM',
    `the run ran out of memory: its container reached container_mode.memory_limit (${memoryLimit}) and the kernel killed it`,
    false,
    {
      ...details,
      suggestions: ['raise container_mode.memory_limit for this agent', 'or ask for a task that needs less memory'],
    },
  )
}

/** Any error as the contract's failure object; suggestions travel in details so `send` can show them. */
export function failureFromError(runId: string, error: unknown, fallbackCode: ErrorCode = 'E_RUN'): AgentRunOutput {
  const gatewayError = toGatewayError(error, fallbackCode)
  const details = {
    ...gatewayError.details,
    ...(gatewayError.suggestions.length > 0 ? {suggestions: gatewayError.suggestions} : {}),
  }
  return failure(
    runId,
    gatewayError.code,
    gatewayError.message,
    gatewayError.retryable,
    Object.keys(details).length > 0 ? details : undefined,
  )
}

/** Reads agent-run's one JSON object; anything else becomes an E_RUN failure with the stderr tail. */
export function parseAgentRunOutput(
  runId: string,
  stdout: string,
  exitCode: number | undefined,
  stderrTail: string,
): AgentRunOutput {
  const text = stdout.trim()
  if (text) {
    try {
      const parsed = JSON.parse(text) as AgentRunOutput
      if (parsed && typeof parsed === 'object' && parsed.version === 1 && typeof parsed.ok === 'boolean') return parsed
    } catch {
      // fall through to the generic failure below
    }
  }
  return failure(runId, 'E_RUN', `agent-run exited with code ${exitCode ?? 'unknown'} without a result`, false, {
    stderr_tail: stderrTail,
  })
}
