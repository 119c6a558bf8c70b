import fs from 'node:fs'
import path from 'node:path'
import type {AgentConfig, ConnectorConfig, LoadedConfig} from '../config/types.js'
import {toGatewayError} from '../util/errors.js'
import {readJsonObject, sendJson} from '../http/json.js'
import type {EngineView} from '../shapes/engine-view.js'
import {HttpError, type Router} from '../http/router.js'
import {isolationLevelFor} from '../shapes/isolation-level.js'
import type {ApiKeyInfo, ApiKeys} from '../state/api-keys.js'
import type {AuditLog} from '../state/audit.js'
import type {RunRecords} from '../state/run-records.js'
import {readyWorkspace} from '../workspace/workspace.js'
import {workspacePath} from '../workspace/location.js'
import {readWorkspaceFile, writeWorkspaceFile} from '../workspace/files.js'
import {clientOf, principalLabel, type CaptainAuth, type Principal} from './auth.js'
import {auditConfigChange} from './config-audit.js'
import {agentWeakenings, imageConfigWeakenings} from './weakenings.js'
import type {BuildJobs} from './build-jobs.js'
import type {ConfigEditor, ConfigEditResult} from './config-editor.js'
import {connectorNames} from '../connectors/index.js'
import {containerImageContext} from '../container/context.js'
import {containerStatus, listGatewayImages} from '../container/status.js'
import {deleteGatewayImage, previewDockerfile, withDraft} from './images.js'
import type {DockerCli} from '../../sandbox/docker/cli.js'
import {inspectImage, planImages} from '../../sandbox/docker/images.js'
import {authed, open} from './respond.js'
import {lastEventId, MAX_STREAMS_PER_PRINCIPAL, StreamLimiter} from './sse.js'

export const API = '/api/captain'
const MAX_SOUL_BYTES = 256 * 1024

/** A connector as the dashboard shows it: type, where it connects, live state; never its tokens. */
export interface ConnectorView {
  name: string
  type: string
  state: string
  /** Why it is not connected (reconnecting, refused), with the next attempt's time. */
  problem?: string
  next_attempt_at?: string
  url?: string
  guild_ids?: string[]
}

export interface LiveConnector {
  name: string
  type: string
  agentId: string
  state: string
  problem?: string
  nextAttempt?: Date
}

export interface CaptainApiDeps {
  router: Router
  auth: CaptainAuth
  apiKeys: ApiKeys
  runs: RunRecords
  audit: AuditLog
  editor: ConfigEditor
  builds: BuildJobs
  docker: () => DockerCli
  connectors: () => ReadonlyArray<LiveConnector>
  engines: () => Promise<EngineView[]>
  /** --unrestricted of the running gateway: every agent's effective level is then unrestricted. */
  unrestricted: boolean
}

export function mountCaptainApi(deps: CaptainApiDeps): void {
  mountAuthRoutes(deps)
  mountAgentRoutes(deps)
  mountContainerRoutes(deps)
}

function mountAuthRoutes({router, auth, apiKeys, audit}: CaptainApiDeps): void {
  router.get(
    `${API}/auth/session`,
    open(({req, res}) => {
      sendJson(res, 200, {
        authenticated: auth.hasSession(req),
        password_set: auth.passwordSet,
        setup_required: !auth.passwordSet,
        password_from_env: auth.passwordFromEnv,
      })
    }),
  )
  // The session token goes in the body, never in a cookie: the page keeps it in its own storage.
  router.post(
    `${API}/auth/login`,
    open(async ({req, res}) => {
      const body = await readJsonObject({req, res}, 16 * 1024)
      sendJson(res, 200, {ok: true, token: await auth.login(req, body.password)})
    }),
  )
  router.post(
    `${API}/auth/setup`,
    open(async ({req, res}) => {
      const body = await readJsonObject({req, res}, 16 * 1024)
      sendJson(res, 200, {ok: true, token: await auth.setup(req, body.code, body.password)})
    }),
  )
  router.post(
    `${API}/auth/link`,
    open(async ({req, res}) => {
      const body = await readJsonObject({req, res}, 16 * 1024)
      sendJson(res, 200, {ok: true, token: auth.loginWithLink(req, body.secret)})
    }),
  )
  router.post(
    `${API}/auth/logout`,
    open(({req, res}) => {
      auth.logout(req)
      sendJson(res, 200, {ok: true})
    }),
  )
  router.post(
    `${API}/auth/password`,
    authed(
      auth,
      async ({req, res}) => {
        const body = await readJsonObject({req, res}, 16 * 1024)
        // every session ended with the change; this browser gets a fresh one
        sendJson(res, 200, {ok: true, token: await auth.changePassword(req, body.current_password, body.new_password)})
      },
      'session',
    ),
  )
  router.get(
    `${API}/auth/api-keys`,
    authed(auth, ({res}) => {
      sendJson(res, 200, apiKeys.list().map(keyView))
    }),
  )
  router.post(
    `${API}/auth/api-keys`,
    authed(auth, async ({req, res, principal}) => {
      const body = await readJsonObject({req, res})
      if (typeof body.name !== 'string') throw new HttpError(400, 'E_INPUT', 'field "name" must be a string')
      if (body.admin !== undefined && typeof body.admin !== 'boolean')
        throw new HttpError(400, 'E_INPUT', 'field "admin" must be true or false')
      const created = apiKeys.create(body.name, body.admin ? 'admin' : 'chat')
      const info = apiKeys.list().find((key) => key.id === created.id)
      audit.record({
        event: 'api_key_created',
        principal: principalLabel(principal),
        source: clientOf(req),
        summary: `${created.kind} key ${created.id} (${created.name}) created`,
        details: {id: created.id, kind: created.kind},
      })
      sendJson(res, 201, {
        id: created.id,
        name: created.name,
        kind: created.kind,
        key: created.key,
        prefix: info?.key_prefix ?? created.key.slice(0, 11),
      })
    }),
  )
  router.add(
    'DELETE',
    `${API}/auth/api-keys/:id`,
    authed(auth, ({req, res, params, principal}) => {
      const revoked = apiKeys.revoke(params.id as string)
      audit.record({
        event: 'api_key_revoked',
        principal: principalLabel(principal),
        source: clientOf(req),
        summary: `${revoked.kind} key ${revoked.id} (${revoked.name}) revoked`,
        details: {id: revoked.id},
      })
      sendJson(res, 200, keyView(revoked))
    }),
  )
}

function keyView(key: ApiKeyInfo) {
  return {
    id: key.id,
    name: key.name,
    kind: key.kind,
    prefix: key.key_prefix,
    created_at: key.created_at,
    last_used_at: key.last_used_at,
    revoked_at: key.revoked_at,
    revoked: key.revoked_at !== null,
  }
}

function mountAgentRoutes(deps: CaptainApiDeps): void {
  const {router, auth, editor, runs} = deps
  const agentOr404 = (id: string): AgentConfig => {
    const agent = editor.loaded.config.agents.find((candidate) => candidate.id === id)
    if (!agent) throw new HttpError(404, 'E_AGENT_UNKNOWN', `unknown agent "${id}"`)
    return agent
  }

  router.get(
    `${API}/config`,
    authed(auth, ({res}) => {
      const refused = editor.catchUp()
      sendJson(res, 200, {path: editor.loaded.path, refused: refused ?? null})
    }),
  )
  router.get(
    `${API}/agents`,
    authed(auth, ({res}) => {
      editor.catchUp()
      sendJson(
        res,
        200,
        editor.loaded.config.agents.map((agent) => agentSummary(shownAgent(editor, agent), editor.loaded, deps)),
      )
    }),
  )
  router.get(
    `${API}/agents/:id`,
    authed(auth, ({res, params}) => {
      editor.catchUp()
      const agent = shownAgent(editor, agentOr404(params.id as string))
      sendJson(res, 200, {
        ...agentSummary(agent, editor.loaded, deps),
        max_iterations: agent.max_iterations,
        timeout_seconds: agent.timeout_seconds,
        container_mode: agent.container_mode,
        file_access: agent.file_access,
        secrets: agent.secrets,
        configured: withoutTokens(editor.rawAgent(agent.id)),
        recent_runs: runs.listWithFiles({agentId: agent.id, limit: 10}),
      })
    }),
  )
  router.add(
    'PATCH',
    `${API}/agents/:id`,
    authed(auth, async ({req, res, params, principal}) => {
      const id = params.id as string
      // a hand edit is applied and audited as such first: this edit's audit holds only what it changed
      editor.catchUpToEdit()
      const before = agentOr404(id)
      const body = await readJsonObject({req, res})
      const result = editor.patchAgent(id, body)
      const after = agentOr404(id)
      auditConfigChange(deps.audit, {
        what: `agent ${id}`,
        principal: principalLabel(principal),
        source: clientOf(req),
        before: result.writtenBefore,
        after: result.writtenAfter,
        weakenings: agentWeakenings(before, after),
      })
      const agent = shownAgent(editor, after)
      sendJson(res, 200, {
        ok: true,
        ...editOutcome(result),
        agent: {
          ...agentSummary(agent, result.loaded, deps),
          container_mode: agent.container_mode,
          file_access: agent.file_access,
          max_iterations: agent.max_iterations,
          timeout_seconds: agent.timeout_seconds,
        },
      })
    }),
  )
  router.get(
    `${API}/agents/:id/soul`,
    authed(auth, ({res, params}) => {
      const agent = agentOr404(params.id as string)
      const workspace = workspacePath(editor.loaded.home, agent.id)
      // the agent owns its workspace: a planted link, FIFO or device answers E_WORKSPACE, never what it points at
      const content = fs.existsSync(workspace)
        ? readWorkspaceFile(workspace, 'SOUL.md', {maxBytes: MAX_SOUL_BYTES})
        : undefined
      sendJson(res, 200, {
        agent_id: agent.id,
        path: path.join(workspace, 'SOUL.md'),
        content: content ?? '',
        exists: content !== undefined,
      })
    }),
  )
  router.add(
    'PUT',
    `${API}/agents/:id/soul`,
    authed(auth, async ({req, res, params, principal}) => {
      const agent = agentOr404(params.id as string)
      const body = await readJsonObject({req, res}, MAX_SOUL_BYTES + 4096)
      if (typeof body.content !== 'string') throw new HttpError(400, 'E_INPUT', 'field "content" must be a string')
      if (Buffer.byteLength(body.content) > MAX_SOUL_BYTES)
        throw new HttpError(413, 'E_INPUT', `SOUL.md may be at most ${MAX_SOUL_BYTES / 1024} KB`)
      const workspace = (await readyWorkspace(editor.loaded.home, agent.id, agent.limits.disk)).path
      writeWorkspaceFile(workspace, 'SOUL.md', body.content, {mode: 0o644})
      deps.audit.record({
        event: 'soul_changed',
        principal: principalLabel(principal),
        source: clientOf(req),
        summary: `agent ${agent.id}: SOUL.md replaced (${Buffer.byteLength(body.content)} bytes)`,
      })
      sendJson(res, 200, {
        ok: true,
        agent_id: agent.id,
        path: path.join(workspace, 'SOUL.md'),
        bytes: Buffer.byteLength(body.content),
      })
    }),
  )
  router.get(
    `${API}/runs`,
    authed(auth, ({res, url}) => {
      const agent = url.searchParams.get('agent') ?? undefined
      const limitText = url.searchParams.get('limit')
      const limit = limitText === null ? 50 : Number(limitText)
      if (!Number.isInteger(limit) || limit < 1 || limit > 500)
        throw new HttpError(400, 'E_INPUT', 'limit must be an integer from 1 to 500')
      sendJson(res, 200, runs.listWithFiles({agentId: agent, limit}))
    }),
  )
}

/** The agent as config.yaml writes it (agent_defaults included): `$NAME` references stay references. */
function shownAgent(editor: ConfigEditor, agent: AgentConfig): AgentConfig {
  return editor.asWritten(agent, editor.writtenAgent(agent.id))
}

function agentSummary(agent: AgentConfig, loaded: LoadedConfig, deps: CaptainApiDeps) {
  const workspace = workspacePath(loaded.home, agent.id)
  const providers = deps.editor.asWritten(loaded.config.providers, deps.editor.writtenProviders())
  const live = new Map(
    deps
      .connectors()
      .filter((connector) => connector.agentId === agent.id)
      .map((connector) => [connector.name, connector]),
  )
  const names = connectorNames(agent.id, agent.connectors)
  return {
    id: agent.id,
    name: agent.name,
    isolation: isolationLevelFor(agent, deps.unrestricted),
    provider: agent.provider ?? providers.primary,
    model: agent.model ?? providers.providers[agent.provider ?? providers.primary]?.model ?? null,
    connectors: agent.connectors.map((connector, index) =>
      connectorView(connector, names[index] as string, live.get(names[index] as string)),
    ),
    workspace,
    workspace_exists: fs.existsSync(workspace),
  }
}

/** `not running`: the gateway could not set the connector up (its log says why), or no gateway runs it. */
function connectorView(connector: ConnectorConfig, name: string, live: LiveConnector | undefined): ConnectorView {
  return {
    name,
    type: connector.type,
    state: live?.state ?? 'not running',
    ...(live?.problem ? {problem: live.problem} : {}),
    ...(live?.nextAttempt ? {next_attempt_at: live.nextAttempt.toISOString()} : {}),
    ...(connector.type === 'meepachat' ? {url: connector.url} : {}),
    ...(connector.type === 'discord' ? {guild_ids: connector.guild_ids} : {}),
  }
}

/** Raw agent fields for the edit form; connector tokens are replaced by whether they are set. */
function withoutTokens(raw: Record<string, unknown>): Record<string, unknown> {
  const {connectors, ...rest} = raw
  return Array.isArray(connectors)
    ? {...rest, connectors: connectors.map((c) => ({type: (c as {type?: unknown})?.type}))}
    : rest
}

function editOutcome(result: ConfigEditResult) {
  return {applied: result.applied, restart_required: result.restart_required, warnings: result.warnings}
}

/** Streams count against whoever opened them: one session or one key cannot hold the server's sockets. */
function principalKey(principal: Principal): string {
  return principal.kind === 'session' ? `session:${principal.token}` : `key:${principal.keyId}`
}

function mountContainerRoutes(deps: CaptainApiDeps): void {
  const {router, auth, editor, builds} = deps
  const streams = new StreamLimiter(MAX_STREAMS_PER_PRINCIPAL)

  const shownImageConfig = () => editor.asWritten(editor.loaded.config.image_config, editor.rawImageConfig())
  router.get(
    `${API}/container/config`,
    authed(auth, ({res}) => {
      editor.catchUp()
      sendJson(res, 200, {image_config: shownImageConfig(), configured: editor.rawImageConfig()})
    }),
  )
  router.add(
    'PUT',
    `${API}/container/config`,
    authed(auth, async ({req, res, principal}) => {
      const body = await readJsonObject({req, res})
      const section = (body.image_config ?? body) as unknown
      if (!section || typeof section !== 'object' || Array.isArray(section))
        throw new HttpError(400, 'E_INPUT', 'send the image_config fields as a JSON object')
      editor.catchUpToEdit()
      const before = editor.loaded.config.image_config
      const result = editor.putImageConfig(section as Record<string, unknown>)
      auditConfigChange(deps.audit, {
        what: 'image_config',
        principal: principalLabel(principal),
        source: clientOf(req),
        before: result.writtenBefore,
        after: result.writtenAfter,
        weakenings: imageConfigWeakenings(before, result.loaded.config.image_config),
      })
      sendJson(res, 200, {ok: true, ...editOutcome(result), image_config: shownImageConfig()})
    }),
  )
  router.get(
    `${API}/container/dockerfile`,
    authed(auth, async ({res, url}) => {
      const draftText = url.searchParams.get('draft')
      let draft: unknown
      if (draftText !== null) {
        try {
          draft = JSON.parse(draftText)
        } catch {
          throw new HttpError(400, 'E_INPUT', 'draft must be JSON (the image_config fields being edited)')
        }
      }
      const imageConfig = withDraft(editor.loaded.config, draft)
      sendJson(
        res,
        200,
        await previewDockerfile(imageConfig, containerImageContext(editor.loaded.home, {cli: deps.docker()})),
      )
    }),
  )
  router.post(
    `${API}/container/build`,
    authed(auth, async ({req, res, principal}) => {
      const body =
        req.headers['content-length'] === '0' || !req.headers['content-type'] ? {} : await readJsonObject({req, res})
      const {build, started} = builds.start(editor.loaded, {force: body.force === true})
      if (started)
        deps.audit.record({
          event: 'image_build',
          principal: principalLabel(principal),
          source: clientOf(req),
          summary: `container image build ${build.id} started${build.force ? ' (forced)' : ''}`,
        })
      sendJson(res, started ? 202 : 409, {
        build,
        events_url: `${API}/container/build/${build.id}/events`,
        ...(started ? {} : {error: {code: 'E_BUSY', message: 'a build is already running; follow it instead'}}),
      })
    }),
  )
  router.get(
    `${API}/container/build/:id`,
    authed(auth, ({res, params}) => {
      const build = builds.get(params.id as string)
      if (!build) throw new HttpError(404, 'E_NOT_FOUND', `no build ${params.id}`)
      sendJson(res, 200, build)
    }),
  )
  router.get(
    `${API}/container/build/:id/events`,
    authed(auth, async ({req, res, url, params, principal}) => {
      const id = params.id as string
      if (!builds.get(id)) throw new HttpError(404, 'E_NOT_FOUND', `no build ${id}`)
      const stream = streams.open(principalKey(principal), req, res)
      const unsubscribe = builds.subscribe(id, lastEventId(req, url), (event) => {
        stream.send(event.type, event.data, event.id)
        // the stream ends with the build, so the client knows there is nothing more to wait for
        if (event.type === 'done') setImmediate(() => stream.close())
      })
      await stream.closed
      unsubscribe()
    }),
  )
  router.add(
    'DELETE',
    `${API}/container/images/:tag`,
    authed(auth, async ({req, res, params, principal}) => {
      const deleted = await deleteGatewayImage(deps.docker(), params.tag as string)
      deps.audit.record({
        event: 'image_deleted',
        principal: principalLabel(principal),
        source: clientOf(req),
        summary: `image ${deleted.deleted} deleted`,
      })
      sendJson(res, 200, {ok: true, ...deleted})
    }),
  )
  router.get(
    `${API}/engines`,
    authed(auth, async ({res}) => sendJson(res, 200, await deps.engines())),
  )
  router.get(
    `${API}/container/status`,
    authed(auth, async ({res}) => {
      sendJson(res, 200, await dashboardContainerStatus(deps))
    }),
  )
}

/**
 * What the Container Mode page shows: the engine, the image image_config builds (whether or not an
 * agent uses it yet), each container-mode agent's images and every gateway image. An engine that
 * cannot be reached is part of the answer (with the fix), not an error.
 */
async function dashboardContainerStatus(deps: CaptainApiDeps) {
  const loaded = deps.editor.loaded
  const cli = deps.docker()
  const signal = AbortSignal.timeout(30_000)
  const base = {
    image_config: deps.editor.asWritten(loaded.config.image_config, deps.editor.rawImageConfig()),
    build: deps.builds.running ?? deps.builds.latest() ?? null,
  }
  let status
  try {
    status = await containerStatus(loaded, {cli, signal})
  } catch (error) {
    return {
      ...base,
      docker: {ok: false, error: toGatewayError(error, 'E_DOCKER').toJSON()},
      container_image: null,
      agents: [],
      images: [],
    }
  }
  let containerImage: Record<string, unknown> | null
  try {
    const context = containerImageContext(loaded.home, {cli, signal})
    const plan = await planImages(
      {...loaded.config, image_config: {...loaded.config.image_config, enabled: true}},
      undefined,
      context,
    )
    const tag = plan.container?.tag ?? plan.baseRef
    const info = await inspectImage(cli, tag, signal)
    containerImage = {
      tag,
      source: plan.source,
      exists: Boolean(info),
      ...(info ? {id: info.id, size: info.size, created: info.created} : {}),
    }
  } catch (error) {
    containerImage = {error: toGatewayError(error, 'E_IMAGE').toJSON()}
  }
  return {
    ...base,
    docker: {ok: true, version: status.engine.server_version},
    container_image: containerImage,
    agents: status.agents,
    containers: status.containers,
    images: await listGatewayImages(loaded, {cli, signal}),
  }
}
