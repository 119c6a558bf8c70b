/**
 * What the gateway last learned about the Docker engine from its runs: a problem (hung, down)
 * is set by the container runner when a call got no answer, and cleared once the engine answers
 * again. Kept apart from the runner so /healthz can read it without loading Docker code.
 */
export interface EngineProblem {
  reason: string
  since: number
}

let problem: EngineProblem | undefined

export function dockerEngineProblem(): EngineProblem | undefined {
  return problem
}

export function reportEngineProblem(reason: string): void {
  problem = {reason, since: problem?.since ?? Date.now()}
}

export function reportEngineAnswered(): void {
  problem = undefined
}

/** Each engine of the `engines:` list, by name: down (with why and since when) or answering. */
const engines = new Map<string, {down?: EngineProblem}>()

export function engineStates(): ReadonlyMap<string, {down?: EngineProblem}> {
  return engines
}

/** Called with an engine's name when it is marked down (it was up): what is held there is dropped. */
const downListeners = new Set<(name: string) => void>()

export function onEngineDown(listener: (name: string) => void): void {
  downListeners.add(listener)
}

export function markEngineDown(name: string, reason: string): void {
  const wasDown = engines.get(name)?.down
  engines.set(name, {down: {reason, since: wasDown?.since ?? Date.now()}})
  if (!wasDown) for (const listener of downListeners) listener(name)
}

export function markEngineUp(name: string): void {
  engines.set(name, {})
}

/** `engine NAME down: why (since …)` for each engine of the list that does not answer, for /healthz. */
export function downEngineReasons(): string[] {
  return [...engines]
    .filter(([, state]) => state.down)
    .map(([name, {down}]) => `engine ${name} down: ${down!.reason} (since ${new Date(down!.since).toISOString()})`)
}

/** Each engine's version, as its last answer gave it (the watch, the local probe). */
const versions = new Map<string, string>()

export function noteEngineVersion(name: string, version: string): void {
  versions.set(name, version)
}

export function engineVersion(name: string): string | undefined {
  return versions.get(name)
}
