import crypto from 'node:crypto'
import type {LoadedConfig} from '../config/types.js'
import {buildContainerImages, containerAgents} from '../container/build.js'
import {containerImageContext} from '../container/context.js'
import {GatewayError, toGatewayError} from '../util/errors.js'
import type {DockerCli} from '../../sandbox/docker/cli.js'
import {ensureContainerImage, planImages, type EnsureResult} from '../../sandbox/docker/images.js'

export type BuildStatus = 'running' | 'succeeded' | 'failed'

export interface BuildEvent {
  /** 1, 2, 3…: the SSE event id, so a reconnecting client resumes where it stopped. */
  id: number
  type: 'log' | 'done'
  data: {line: string; time: number} | BuildSummary
}

export interface BuildSummary {
  id: string
  status: BuildStatus
  force: boolean
  started_at: number
  finished_at: number | null
  tag: string | null
  result: EnsureResult | null
  error: {code: string; message: string; suggestions?: string[]} | null
}

interface BuildJob {
  summary: BuildSummary
  events: BuildEvent[]
  listeners: Set<(event: BuildEvent) => void>
  controller: AbortController
}

/** Lines kept per build for late subscribers; a long apt-get log is cut from the start. */
const MAX_EVENTS = 5000
const KEPT_JOBS = 10

/**
 * Container-image builds started from the dashboard. One runs at a time (a second request gets
 * the running one back); every log line is kept as an event, so the SSE stream of a build can be
 * opened, closed and reopened at any point and still show the whole story.
 */
export class BuildJobs {
  private readonly jobs = new Map<string, BuildJob>()

  constructor(private readonly cli: () => DockerCli) {}

  get(id: string): BuildSummary | undefined {
    return this.jobs.get(id)?.summary
  }

  get running(): BuildSummary | undefined {
    return [...this.jobs.values()].find((job) => job.summary.status === 'running')?.summary
  }

  latest(): BuildSummary | undefined {
    return [...this.jobs.values()].at(-1)?.summary
  }

  /**
   * Starts building the container image that image_config describes (also while no agent uses it
   * yet), then whatever else the container-mode agents need, exactly as `container build` does.
   */
  start(loaded: LoadedConfig, options: {force?: boolean} = {}): {build: BuildSummary; started: boolean} {
    const running = this.running
    if (running) return {build: running, started: false}
    const id = `build_${crypto.randomBytes(6).toString('hex')}`
    const job: BuildJob = {
      summary: {
        id,
        status: 'running',
        force: Boolean(options.force),
        started_at: Date.now(),
        finished_at: null,
        tag: null,
        result: null,
        error: null,
      },
      events: [],
      listeners: new Set(),
      controller: new AbortController(),
    }
    this.jobs.set(id, job)
    this.trim()
    void this.run(job, loaded)
    return {build: job.summary, started: true}
  }

  /** Events after `afterId`, then live ones; returns an unsubscribe function. */
  subscribe(id: string, afterId: number, listener: (event: BuildEvent) => void): () => void {
    const job = this.jobs.get(id)
    if (!job) throw new GatewayError('E_NOT_FOUND', `no build ${id} (only the last ${KEPT_JOBS} are kept)`)
    for (const event of job.events) if (event.id > afterId) listener(event)
    if (job.summary.status !== 'running') return () => {}
    job.listeners.add(listener)
    return () => job.listeners.delete(listener)
  }

  /** Aborts running builds (gateway shutdown). */
  abortAll(): void {
    for (const job of this.jobs.values()) job.controller.abort(new Error('the gateway is shutting down'))
  }

  private async run(job: BuildJob, loaded: LoadedConfig): Promise<void> {
    const log = (line: string) => this.emit(job, 'log', {line, time: Date.now()})
    const {config} = loaded
    const cli = this.cli()
    const signal = job.controller.signal
    try {
      const context = containerImageContext(loaded.home, {cli, signal, onLog: log})
      // Build what the settings describe, even while container images are switched off for runs.
      const plan = await planImages(
        {...config, image_config: {...config.image_config, enabled: true}},
        undefined,
        context,
      )
      if (!plan.container) {
        throw new GatewayError(
          'E_CONFIG',
          `image_config.image is set (${config.image_config.image}), so there is nothing to build from image_config`,
          {
            suggestions: ['clear image_config.image to build from base_image and packages'],
          },
        )
      }
      job.summary.tag = plan.container.tag
      log(`image ${plan.container.tag}`)
      const result = await ensureContainerImage(plan, context, {force: job.summary.force})
      if (!result) throw new GatewayError('E_INTERNAL', 'the image pipeline returned no result')
      log(result.built ? `built ${result.tag} (${result.reason})` : `${result.tag} is up to date; nothing to build`)
      if (containerAgents(loaded).length > 0) {
        log('preparing the images of the container-mode agents (meepagateway container build)')
        // not forced: isolation images rebuild by themselves when their base changed
        await buildContainerImages({loaded, display: 'lines', onLog: log, signal, cli})
      }
      job.summary.result = result
      job.summary.status = 'succeeded'
    } catch (error) {
      const gatewayError = toGatewayError(error, 'E_IMAGE')
      log(`build failed: ${gatewayError.message}`)
      job.summary.error = {
        code: gatewayError.code,
        message: gatewayError.message,
        ...(gatewayError.suggestions.length ? {suggestions: gatewayError.suggestions} : {}),
      }
      job.summary.status = 'failed'
    }
    job.summary.finished_at = Date.now()
    this.emit(job, 'done', {...job.summary})
    job.listeners.clear()
  }

  private emit(job: BuildJob, type: BuildEvent['type'], data: BuildEvent['data']): void {
    const event: BuildEvent = {id: (job.events.at(-1)?.id ?? 0) + 1, type, data}
    job.events.push(event)
    if (job.events.length > MAX_EVENTS) job.events.splice(0, job.events.length - MAX_EVENTS)
    for (const listener of job.listeners) listener(event)
  }

  private trim(): void {
    for (const [id, job] of this.jobs) {
      if (this.jobs.size <= KEPT_JOBS) break
      if (job.summary.status !== 'running') this.jobs.delete(id)
    }
  }
}
