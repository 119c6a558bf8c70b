import {GatewayError} from '../util/errors.js'
import type {AgentRunInput} from '../shapes/agent-run-contract.js'

/** Largest stdin accepted: a message plus config is small; anything bigger is a mistake or an attack. */
export const MAX_INPUT_BYTES = 8 * 1024 * 1024

function inputError(message: string): GatewayError {
  return new GatewayError('E_INPUT', message, {
    suggestions: [
      'agent-run reads one JSON object on stdin: {version: 1, run_id, agent, providers, secrets, message, workspace} (docs/agent-run.md)',
    ],
  })
}

const isObject = (value: unknown): value is Record<string, unknown> =>
  typeof value === 'object' && value !== null && !Array.isArray(value)

/** Validates the stdin object; every missing or mistyped field is named in one error. */
export function parseAgentRunInput(text: string): AgentRunInput {
  if (!text.trim()) throw inputError('no input on stdin')
  let value: unknown
  try {
    value = JSON.parse(text)
  } catch (error) {
    throw inputError(`stdin is not valid JSON: ${(error as Error).message}`)
  }
  if (!isObject(value)) throw inputError('stdin must be one JSON object')
  const problems: string[] = []
  const expect = (ok: boolean, problem: string) => {
    if (!ok) problems.push(problem)
  }
  expect(value.version === 1, `version: must be 1 (got ${JSON.stringify(value.version)})`)
  expect(typeof value.run_id === 'string' && value.run_id.length > 0, 'run_id: must be a non-empty string')
  expect(typeof value.workspace === 'string' && value.workspace.startsWith('/'), 'workspace: must be an absolute path')
  const agent = value.agent
  if (isObject(agent)) {
    expect(typeof agent.id === 'string', 'agent.id: must be a string')
    expect(
      typeof agent.max_iterations === 'number' && agent.max_iterations >= 1,
      'agent.max_iterations: must be a number >= 1',
    )
    expect(isObject(agent.file_access), 'agent.file_access: must be an object')
  } else problems.push('agent: must be an object')
  const providers = value.providers
  if (isObject(providers)) {
    expect(typeof providers.primary === 'string', 'providers.primary: must be a string')
    expect(Array.isArray(providers.fallback), 'providers.fallback: must be an array')
    expect(isObject(providers.providers), 'providers.providers: must be an object')
  } else problems.push('providers: must be an object')
  const secrets = value.secrets
  expect(
    isObject(secrets) && Object.values(secrets).every((v) => typeof v === 'string'),
    'secrets: must be an object of strings',
  )
  const message = value.message
  if (isObject(message)) {
    for (const key of ['id', 'connector', 'channel_id', 'content'] as const) {
      expect(typeof message[key] === 'string', `message.${key}: must be a string`)
    }
    expect(
      isObject(message.user) && typeof message.user.id === 'string' && typeof message.user.name === 'string',
      'message.user: must be {id, name}',
    )
  } else problems.push('message: must be an object')
  expect(
    value.timeout_ms === undefined || (typeof value.timeout_ms === 'number' && value.timeout_ms > 0),
    'timeout_ms: must be a number > 0 when set',
  )
  if (problems.length > 0) throw inputError(`invalid agent-run input: ${problems.join('; ')}`)
  return value as unknown as AgentRunInput
}
