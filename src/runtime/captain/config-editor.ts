import YAML from 'yaml'
import fs from 'node:fs'
import type {AgentConfig, LoadedConfig} from '../config/types.js'
import {resolveAgent} from '../config/load.js'
import {patchToEdits, updateConfigFile, type ConfigEdit} from '../config/write.js'
import {HttpError} from '../http/router.js'
import {validateImageRef} from '../../sandbox/docker/dockerfile.js'

/** What a dashboard edit changed, for listeners that apply it to the running gateway. */
export type ConfigChange = {section: 'agent'; agentId: string} | {section: 'image_config'}

/**
 * Applies a written config to the running gateway. Return the parts that could not be applied
 * live (e.g. a connector that needs a reconnect), so the dashboard can say a restart is needed.
 */
export type ConfigListener = (loaded: LoadedConfig, change: ConfigChange) => void | {restartRequired?: string[]}

export interface ConfigEditResult {
  loaded: LoadedConfig
  /** The edited section before and after, as written in the file (for the audit log). */
  writtenBefore: Record<string, unknown>
  writtenAfter: Record<string, unknown>
  /** Listeners applied the change to the running gateway (none registered counts as not applied). */
  applied: boolean
  restart_required: string[]
  warnings: string[]
}

/** Agent fields the dashboard edits. Connectors and secrets hold tokens and stay in the file. */
const AGENT_FIELDS = [
  'name',
  'provider',
  'model',
  'max_iterations',
  'timeout_seconds',
  'container_mode',
  'file_access',
] as const
const OBJECT_FIELDS = new Set(['container_mode', 'file_access'])
const IMAGE_CONFIG_FIELDS = [
  'enabled',
  'image',
  'base_image',
  'packages',
  'env_vars',
  'inject_credentials_env',
  'inject_secrets_env',
  'redact_secrets',
] as const

/**
 * Config changes from the dashboard: validated with the CLI's schema, written atomically with
 * comments kept, then handed to the running gateway through listeners.
 *
 * With a gateway that watches config.yaml (`syncFile`), the dashboard edits the file's current
 * text only once the gateway runs it: a pending valid hand edit is applied (and audited) first,
 * and while the file holds a refused one every edit is refused until the file is fixed. A hand
 * edit is thus never applied silently by a dashboard edit, nor overwritten by one.
 */
export class ConfigEditor {
  private readonly listeners = new Set<ConfigListener>()

  constructor(
    private current: LoadedConfig,
    private readonly env: NodeJS.ProcessEnv = process.env,
    /** Catches the running gateway up with config.yaml; returns why its text is refused, if it is. */
    private readonly syncFile?: () => string | undefined,
  ) {}

  get loaded(): LoadedConfig {
    return this.current
  }

  /** Why the gateway refuses config.yaml's current text (after catching up with it), or undefined. */
  catchUp(): string | undefined {
    return this.syncFile?.()
  }

  /** catchUp, for an edit: refused while the file holds a change the gateway refused. */
  catchUpToEdit(): void {
    const refused = this.catchUp()
    if (refused) {
      throw new HttpError(
        409,
        'E_CONFIG',
        `${this.current.path} holds a hand edit the gateway refused, so the dashboard does not edit it: ${refused}. Fix the file first (meepagateway config check names the problems)`,
      )
    }
  }

  /** The gateway applied a config itself (a hand edit of config.yaml): the dashboard shows that one. */
  replace(loaded: LoadedConfig): void {
    this.current = loaded
  }

  onChange(listener: ConfigListener): () => void {
    this.listeners.add(listener)
    return () => this.listeners.delete(listener)
  }

  /** The agent's fields exactly as written in config.yaml (before defaults), for forms that must not pin defaults. */
  rawAgent(id: string): Record<string, unknown> {
    const raw = this.rawConfig()
    const agents = Array.isArray(raw.agents) ? (raw.agents as Array<Record<string, unknown>>) : []
    return agents.find((agent) => agent?.id === id) ?? {}
  }

  /**
   * The agent as the loader builds it (agent field > agent_defaults > built-in), but from the file's
   * text before `$NAME` references are resolved: what `asWritten` overlays, defaults included.
   */
  writtenAgent(id: string): AgentConfig {
    const defaults = this.rawConfig().agent_defaults
    try {
      return resolveAgent(
        {...this.rawAgent(id), id},
        defaults && typeof defaults === 'object' ? (defaults as Partial<AgentConfig>) : {},
      )
    } catch {
      return {id} as AgentConfig // a file broken by hand since: overlay nothing rather than fail the page
    }
  }

  /** The providers section as written (its models may be references too). */
  writtenProviders(): Record<string, unknown> {
    const section = this.rawConfig().providers
    return section && typeof section === 'object' ? (section as Record<string, unknown>) : {}
  }

  rawImageConfig(): Record<string, unknown> {
    const section = this.rawConfig().image_config
    return section && typeof section === 'object' ? (section as Record<string, unknown>) : {}
  }

  patchAgent(id: string, patch: Record<string, unknown>): ConfigEditResult {
    this.catchUpToEdit()
    // the position in the file as the gateway runs it, caught up with hand edits above (unwatched: as it reads now)
    const rawAgents = this.rawConfig().agents
    const index = Array.isArray(rawAgents) ? rawAgents.findIndex((agent) => (agent as {id?: unknown})?.id === id) : -1
    if (index < 0) throw new HttpError(404, 'E_AGENT_UNKNOWN', `unknown agent "${id}" in ${this.current.path}`)
    for (const [key, value] of Object.entries(patch)) {
      if (!(AGENT_FIELDS as readonly string[]).includes(key)) {
        throw new HttpError(
          400,
          'E_INPUT',
          `agents[${index}].${key}: the dashboard cannot change this field (it can change ${AGENT_FIELDS.join(', ')})`,
        )
      }
      if (OBJECT_FIELDS.has(key) && value !== null && (typeof value !== 'object' || Array.isArray(value))) {
        throw new HttpError(400, 'E_INPUT', `agents[${index}].${key}: must be an object`)
      }
      if (!OBJECT_FIELDS.has(key) && value !== null && typeof value === 'object') {
        throw new HttpError(
          400,
          'E_INPUT',
          `agents[${index}].${key}: must be a ${key === 'name' || key === 'provider' || key === 'model' ? 'string' : 'number'}, not ${Array.isArray(value) ? 'an array' : 'an object'}`,
        )
      }
    }
    refuseReferences(patch, `agents[${index}]`)
    const imageRef = (patch.container_mode as {image?: unknown} | null | undefined)?.image
    if (typeof imageRef === 'string' && imageRef.trim())
      checkImageRef(imageRef.trim(), `agents[${index}].container_mode.image`)
    const before = this.current.config.agents.find((agent) => agent.id === id)
    const writtenBefore = this.rawAgent(id)
    const result = this.write(
      patchToEdits(['agents', index], patch),
      {section: 'agent', agentId: id},
      writtenBefore,
      () => this.rawAgent(id),
    )
    const after = result.loaded.config.agents[index] as AgentConfig
    if (after.file_access.unrestricted && !before?.file_access.unrestricted && !after.container_mode.enabled) {
      result.warnings.push(
        `agent ${id} now runs UNRESTRICTED: its shell and file tools can read and change anything this user can, including secrets`,
      )
    }
    return result
  }

  /** Replaces the image_config section: fields left out return to their defaults. */
  putImageConfig(body: Record<string, unknown>): ConfigEditResult {
    this.catchUpToEdit()
    const edits: ConfigEdit[] = []
    for (const key of Object.keys(body)) {
      if (!(IMAGE_CONFIG_FIELDS as readonly string[]).includes(key)) {
        throw new HttpError(
          400,
          'E_INPUT',
          `image_config.${key}: unknown field (known: ${IMAGE_CONFIG_FIELDS.join(', ')})`,
        )
      }
    }
    refuseReferences(body, 'image_config')
    for (const key of ['image', 'base_image'] as const) {
      const value = body[key]
      if (typeof value === 'string' && value.trim()) checkImageRef(value.trim(), `image_config.${key}`)
    }
    for (const key of IMAGE_CONFIG_FIELDS) {
      const value = body[key]
      // whole values, not merged: a package removed in the form must disappear from the file
      edits.push(
        value === undefined || value === null
          ? {path: ['image_config', key], delete: true}
          : {path: ['image_config', key], value},
      )
    }
    return this.write(edits, {section: 'image_config'}, this.rawImageConfig(), () => this.rawImageConfig())
  }

  /**
   * A resolved value with every `$NAME` reference the file has at the same place put back: what
   * the API shows, so no variable of the gateway's environment is ever read back through it.
   */
  asWritten<T>(resolved: T, written: unknown): T {
    return overlayReferences(resolved, written) as T
  }

  private write(
    edits: ConfigEdit[],
    change: ConfigChange,
    writtenBefore: Record<string, unknown>,
    readAfter: () => Record<string, unknown>,
  ): ConfigEditResult {
    const running = this.current.text
    const update = updateConfigFile(this.current.path, edits, {
      env: this.env,
      // a hand edit that landed after the catch-up above: not carried along unaudited
      checkRead: (text) => {
        if (this.syncFile && text !== running)
          throw new HttpError(409, 'E_CONFIG', `${this.current.path} changed while this edit was being made; try again`)
      },
    })
    // Secret values were read from the environment at start-up; the file's references did not change
    this.current = {
      ...this.current,
      config: update.config,
      secrets: {...this.current.secrets, ...update.secrets},
      created: false,
      text: update.text,
    }
    const restartRequired: string[] = []
    for (const listener of this.listeners) {
      const outcome = listener(this.current, change)
      if (outcome?.restartRequired) restartRequired.push(...outcome.restartRequired)
    }
    return {
      loaded: this.current,
      writtenBefore,
      writtenAfter: readAfter(),
      applied: this.listeners.size > 0 && restartRequired.length === 0,
      restart_required: restartRequired,
      warnings: [],
    }
  }

  /** The file as the gateway runs it (watched), else as it reads now. */
  private rawConfig(): Record<string, unknown> {
    try {
      const text =
        this.syncFile && this.current.text !== undefined
          ? this.current.text
          : fs.readFileSync(this.current.path, 'utf8')
      const parsed = YAML.parse(text) as unknown
      return parsed && typeof parsed === 'object' ? (parsed as Record<string, unknown>) : {}
    } catch {
      return {}
    }
  }
}

const ENV_REFERENCE = /^\$(?:\{[A-Za-z_][A-Za-z0-9_]*\}|[A-Za-z_][A-Za-z0-9_]*)$/

/**
 * Values starting with `$` are environment references in config.yaml; through the API they would
 * let a caller read the gateway's environment back (set a name to "$SECRET", then GET it).
 */
function refuseReferences(value: unknown, at: string): void {
  if (typeof value === 'string') {
    if (value.startsWith('$')) {
      throw new HttpError(
        400,
        'E_INPUT',
        `${at}: values starting with "$" are environment references, which the API does not accept; write them in config.yaml by hand`,
      )
    }
    return
  }
  if (Array.isArray(value)) value.forEach((item, index) => refuseReferences(item, `${at}[${index}]`))
  else if (value && typeof value === 'object')
    for (const [key, item] of Object.entries(value)) refuseReferences(item, `${at}.${key}`)
}

function checkImageRef(ref: string, at: string): void {
  try {
    validateImageRef(ref, at)
  } catch (error) {
    throw new HttpError(400, 'E_INPUT', (error as Error).message)
  }
}

function overlayReferences(resolved: unknown, written: unknown): unknown {
  if (typeof written === 'string' && ENV_REFERENCE.test(written)) return written
  if (Array.isArray(resolved))
    return resolved.map((item, index) => overlayReferences(item, Array.isArray(written) ? written[index] : undefined))
  if (resolved && typeof resolved === 'object') {
    const source =
      written && typeof written === 'object' && !Array.isArray(written) ? (written as Record<string, unknown>) : {}
    return Object.fromEntries(
      Object.entries(resolved).map(([key, item]) => [key, overlayReferences(item, source[key])]),
    )
  }
  return resolved
}
