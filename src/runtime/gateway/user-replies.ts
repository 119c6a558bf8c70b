import type {AgentRunFailure} from '../shapes/agent-run-contract.js'

/** What the sender reads; the operator gets the full story in the run record and the log. */
export const BUSY_REPLY =
  "I'm busy with other messages right now, so I couldn't take this one. Please try again in a minute."
export const RESTARTING_REPLY =
  'The gateway is restarting, so I could not take this message. Please send it again in a minute.'
export const INTERRUPTED_REPLY = 'The gateway restarted before I finished this one. Please send it again.'
/** Sent at start-up for a message whose run a crashed gateway left unfinished. */
export const RESTARTED_REPLY =
  'I was restarted before I finished working on your message, so I have no answer for it. Please send it again.'
export const EMPTY_REPLY = '(The agent finished without writing a reply.)'

/** Sent (if the platform takes it) when a reply, or its rest, could not be delivered. */
export function undeliveredRestReply(runId: string, partly: boolean): string {
  return partly
    ? `Sorry, the rest of my answer could not be sent. The operator has the details. (ref ${runId})`
    : `Sorry, my answer could not be sent. The operator has the details. (ref ${runId})`
}

/** A short, plain reply for a failed run, with the run id so the operator can find the record. */
export function failureReply(failure: AgentRunFailure): string {
  const reference = ` (ref ${failure.run_id})`
  switch (failure.error.code) {
    case 'E_TIMEOUT':
      // the deadline passed while the gateway itself was stopped: the run was not slow
      if (failure.error.details?.gateway_suspended_ms !== undefined)
        return `Sorry, I was paused when this message's time ran out, so it was stopped before I could answer. Please send it again.${reference}`
      return `Sorry, that took too long and was stopped before I could answer.${reference}`
    case 'E_OOM':
      return `Sorry, that ran out of memory and was stopped before I could answer.${reference}`
    case 'E_LIMIT':
      return `Sorry, that started more processes than I am allowed and was stopped.${reference}`
    case 'E_DISK':
      return `Sorry, my workspace is full, so that was stopped. The operator has the details.${reference}`
    case 'E_PROVIDER':
      return `Sorry, I can't reach my language model right now. Please try again in a few minutes.${reference}`
    case 'E_SANDBOX':
    case 'E_ISOLATION_UNAVAILABLE':
      return `Sorry, I can't run right now: my sandbox could not be set up on this machine. The operator has the details.${reference}`
    case 'E_DOCKER_HUNG':
    case 'E_DOCKER_DOWN':
      // the engine went away under a started run: what it did so far may stand
      if (failure.error.details?.partly_ran)
        return `Sorry, I couldn't finish: the Docker engine stopped answering while I was working, so I was stopped, and part of the work may already have run. The operator has the details.${reference}`
      if (failure.error.code === 'E_DOCKER_DOWN')
        return `Sorry, I couldn't run: the Docker engine is not answering. The operator has the details.${reference}`
      return `Sorry, I couldn't finish: the Docker engine stopped answering, so I was stopped. The operator has the details.${reference}`
    case 'E_DOCKER':
    case 'E_DOCKER_MISSING':
    case 'E_IMAGE':
      return `Sorry, I can't run right now: my container could not be started. The operator has the details.${reference}`
    default:
      return `Sorry, something went wrong while I was working on that. The operator has the details.${reference}`
  }
}
