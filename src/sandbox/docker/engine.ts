/** What both ways of asking the engine (the docker CLI, the Engine API over its socket) share. */

/** Deadline for calls that only talk to the engine (inspect, ps, rm, kill, version). */
export const DEFAULT_DOCKER_TIMEOUT_MS = 30_000

/** Deadline of the first question: an engine that cannot say its version is reported soon. */
export const PING_TIMEOUT_MS = 10_000

/**
 * The most a ping, version or info answer may be (a real engine's are a few kB): past it the
 * connection is cut, not collected until the deadline.
 */
export const SMALL_ANSWER_MAX_BYTES = 1024 * 1024

/** The most any other answer may be (a list of many containers, an image with a large environment). */
export const ANSWER_MAX_BYTES = 32 * 1024 * 1024

export interface EngineVersion {
  /** The engine's release, e.g. 27.3.1. */
  server: string
  /** The Engine API version it speaks, e.g. 1.47. */
  api: string
}
