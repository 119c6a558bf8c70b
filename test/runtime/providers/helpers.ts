import type {ProviderConfig, ProvidersConfig} from '../../../src/runtime/config/types.js'
import {GatewayError} from '../../../src/runtime/util/errors.js'
import type {ChatRequest, ToolDefinition} from '../../../src/runtime/shapes/provider-types.js'
import type {FakeApi, FakeLlm} from '../../fakes/llm-server.js'

export const SECRETS = {TEST_OPENAI_KEY: 'sk-openai-test', TEST_ANTHROPIC_KEY: 'sk-ant-test'}

/** A provider entry pointing at the fake in the given wire format. */
export function fakeProvider(llm: FakeLlm, api: FakeApi, extra: Partial<ProviderConfig> = {}): ProviderConfig {
  return api === 'openai'
    ? {kind: 'openai', model: 'gpt-test', base_url: llm.openaiBaseUrl, api_key_env: 'TEST_OPENAI_KEY', ...extra}
    : {
        kind: 'anthropic',
        model: 'claude-test',
        base_url: llm.anthropicBaseUrl,
        api_key_env: 'TEST_ANTHROPIC_KEY',
        ...extra,
      }
}

export function providersConfig(
  primary: string,
  providers: Record<string, ProviderConfig>,
  fallback: string[] = [],
): ProvidersConfig {
  return {primary, fallback, providers}
}

export const WRITE_FILE_TOOL: ToolDefinition = {
  name: 'write_file',
  description: 'Write a file in the workspace',
  parameters: {
    type: 'object',
    properties: {path: {type: 'string'}, content: {type: 'string'}},
    required: ['path', 'content'],
  },
}

export function userRequest(content: string, tools: ToolDefinition[] = []): ChatRequest {
  return {system: 'You are a test agent.', messages: [{role: 'user', content}], tools}
}

/** Runs `promise`, expecting it to reject with a GatewayError, and returns that error. */
export async function gatewayErrorOf(promise: Promise<unknown>): Promise<GatewayError> {
  try {
    await promise
  } catch (error) {
    if (error instanceof GatewayError) return error
    throw error
  }
  throw new Error('expected a GatewayError, but the call succeeded')
}

/** A 127.0.0.1 port with nothing listening on it. */
export async function closedPort(): Promise<number> {
  const {createServer} = await import('node:net')
  const server = createServer()
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', () => resolve()))
  const {port} = server.address() as {port: number}
  await new Promise<void>((resolve) => server.close(() => resolve()))
  return port
}
