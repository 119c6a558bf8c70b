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
