import {createRequire} from 'node:module'

const require = createRequire(import.meta.url)

/**
 * Loads an SDK through its CommonJS build. Both SDKs are hundreds of small modules, and on Node 20
 * the ESM loader costs more per module: @anthropic-ai/sdk loads in ~115 ms this way against ~170 ms
 * by `import`, openai in ~35 ms against ~60 ms, and agent-run's start-up time is a measured target.
 */
export function requireSdk<T>(name: string): T {
  return require(name) as T
}
