import type {ServerResponse} from 'node:http'
import type {ErrorCode} from '../util/errors.js'
import {GatewayError} from '../util/errors.js'
import {sendJson} from '../http/json.js'
import type {RequestContext, RouteHandler} from '../http/router.js'
import type {CaptainAuth, Need, Principal} from './auth.js'

const STATUS_BY_CODE: Partial<Record<ErrorCode, number>> = {
  E_CONFIG: 400,
  E_INPUT: 400,
  E_USAGE: 400,
  E_AUTH: 401,
  E_NOT_FOUND: 404,
  E_AGENT_UNKNOWN: 404,
  E_WORKSPACE: 409,
  E_BUSY: 409,
  E_IMAGE: 422,
  E_DOCKER: 502,
  E_DOCKER_MISSING: 503,
  E_DOCKER_DOWN: 503,
  E_DOCKER_HUNG: 503,
}

/** A runtime error as a JSON answer that keeps its suggestions and details (e.g. every config problem). */
export function sendGatewayError(res: ServerResponse, error: GatewayError): void {
  sendJson(res, STATUS_BY_CODE[error.code] ?? 500, {error: error.toJSON()})
}

export type CaptainHandler = (context: RequestContext & {principal: Principal}) => Promise<void> | void

/** Wraps a dashboard API handler: authentication first (admin unless told), then runtime errors mapped to statuses. */
export function authed(auth: CaptainAuth, handler: CaptainHandler, need: Need = 'admin'): RouteHandler {
  return async (context) => {
    const principal = auth.authenticate(context.req, need)
    await answerErrors(context.res, () => handler({...context, principal}))
  }
}

/** Like `authed` without authentication (login, setup, session state). */
export function open(handler: RouteHandler): RouteHandler {
  return (context) => answerErrors(context.res, () => handler(context))
}

async function answerErrors(res: ServerResponse, run: () => Promise<void> | void): Promise<void> {
  try {
    await run()
  } catch (error) {
    if (error instanceof GatewayError && !res.headersSent) {
      sendGatewayError(res, error)
      return
    }
    throw error
  }
}
