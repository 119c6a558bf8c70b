import type {DockerCli} from '../../sandbox/docker/cli.js'
import {
  ensureContainerImage,
  ensureIsolationImage,
  planImages,
  type EnsureResult,
  type ImageContext,
  type ImagePlan,
} from '../../sandbox/docker/images.js'
import {findAgent} from '../config/load.js'
import type {AgentConfig, LoadedConfig} from '../config/types.js'
import {escapeControls} from '../util/escape-controls.js'
import {containerImageContext} from './context.js'

/**
 * `container build`: makes every image the container-mode agents need, and nothing else. Images
 * that are up to date are left alone (no `docker build` at all), so running it from cron or after
 * every deploy is cheap.
 */
export interface ContainerBuildOptions {
  loaded: LoadedConfig
  /** Only this agent (built even if its container_mode is off, to prepare switching it on). */
  agentId?: string
  force?: boolean
  /** 'tasks': a listr2 task list (terminal); 'lines': plain progress lines via onLog; 'silent': none (--json). */
  display: 'tasks' | 'lines' | 'silent'
  onLog?: (line: string) => void
  signal?: AbortSignal
  cli?: DockerCli
  /** Only the agents whose runs may go to this engine of the `engines:` list. */
  engine?: string
}

export interface ImageBuildReport {
  tag: string
  built: boolean
  reason: string
}

export interface ContainerBuildEntry {
  agents: string[]
  base: string
  source: ImagePlan['source']
  dockerfile?: string
  container_image?: ImageBuildReport
  isolation_image: ImageBuildReport
}

export interface ContainerBuildResult {
  images: ContainerBuildEntry[]
  /** How many images were actually built (0 when everything was up to date). */
  built: number
  /** Set when there was nothing to build, with the reason. */
  note?: string
}

/**
 * Agents whose images `container build` and `container status` are about; given an engine of the
 * `engines:` list, only those whose runs may go there (container_mode.engines).
 */
export function containerAgents(loaded: LoadedConfig, agentId?: string, engine?: string): AgentConfig[] {
  const agents = agentId
    ? [findAgent(loaded, agentId)]
    : loaded.config.agents.filter((agent) => agent.container_mode.enabled)
  return engine === undefined ? agents : agents.filter((agent) => runsOn(agent, engine))
}

/** Whether an agent's runs may be placed on the named engine. */
export function runsOn(agent: AgentConfig, engine: string): boolean {
  return !agent.container_mode.engines || agent.container_mode.engines.includes(engine)
}

export async function buildContainerImages(options: ContainerBuildOptions): Promise<ContainerBuildResult> {
  const agents = containerAgents(options.loaded, options.agentId, options.engine)
  if (agents.length === 0) {
    return {
      images: [],
      built: 0,
      note: 'no agent has container_mode.enabled: true; nothing to build (use --agent ID to build for one anyway)',
    }
  }
  const entries: ContainerBuildEntry[] = []
  const steps = agents.map((agent) => ({agent, plan: undefined as ImagePlan | undefined}))
  const context = (onLog?: (line: string) => void): ImageContext =>
    containerImageContext(options.loaded.home, {cli: options.cli, signal: options.signal, onLog})

  // Agents that share images (same config) share one entry: each image is built once.
  const entryFor = (plan: ImagePlan, agent: AgentConfig): ContainerBuildEntry | undefined => {
    const existing = entries.find((entry) => entry.isolation_image.tag === plan.isolationTag)
    if (existing) {
      existing.agents.push(agent.id)
      return undefined
    }
    const entry: ContainerBuildEntry = {
      agents: [agent.id],
      base: plan.baseRef,
      source: plan.source,
      ...(plan.container ? {dockerfile: plan.container.dockerfile} : {}),
      isolation_image: {tag: plan.isolationTag, built: false, reason: 'pending'},
    }
    entries.push(entry)
    return entry
  }
  const report = (result: EnsureResult): ImageBuildReport => ({
    tag: result.tag,
    built: result.built,
    reason: result.reason,
  })

  const tasks = steps.map((step) => ({
    title: `agent ${step.agent.id}`,
    steps: [
      {
        title: 'generate Dockerfile',
        run: async (log: (line: string) => void) => {
          step.plan = await planImages(options.loaded.config, step.agent, context(log))
          return step.plan.container ? `${step.plan.container.tag}` : `base ${step.plan.baseRef} (${step.plan.source})`
        },
      },
      {
        title: 'build container image',
        run: async (log: (line: string) => void) => {
          const plan = step.plan!
          const entry = entryFor(plan, step.agent)
          if (!entry) return 'shared with another agent'
          if (!plan.container) return `not needed: using ${plan.baseRef}`
          const result = (await ensureContainerImage(plan, context(log), {force: options.force}))!
          entry.container_image = report(result)
          return `${result.tag}: ${result.built ? `built (${result.reason})` : 'up to date'}`
        },
      },
      {
        title: 'build isolation image',
        run: async (log: (line: string) => void) => {
          const plan = step.plan!
          const entry = entries.find((candidate) => candidate.isolation_image.tag === plan.isolationTag)!
          if (entry.isolation_image.reason !== 'pending') return 'shared with another agent'
          const result = await ensureIsolationImage(plan, context(log), {force: options.force})
          entry.isolation_image = report(result)
          return `${result.tag}: ${result.built ? `built (${result.reason})` : 'up to date'}`
        },
      },
    ],
  }))

  if (options.display === 'tasks') {
    // listr2 only on a terminal: cron and --json runs do not pay for loading it
    const {Listr} = await import('listr2')
    await new Listr(
      tasks.map((agentTask) => ({
        title: agentTask.title,
        task: (_ctx, parent) =>
          parent.newListr(
            agentTask.steps.map((step) => ({
              title: step.title,
              task: async (_stepCtx, task) => {
                const summary = await step.run((line) => (task.output = escapeControls(line)))
                task.title = `${step.title}: ${summary}`
              },
              rendererOptions: {outputBar: 5},
            })),
          ),
      })),
      {renderer: 'default', exitOnError: true, concurrent: false},
    ).run()
  } else {
    const log = options.display === 'lines' ? (options.onLog ?? (() => {})) : () => {}
    for (const agentTask of tasks) {
      for (const step of agentTask.steps) {
        const summary = await step.run((line) => log(`  ${escapeControls(line)}`))
        log(`${agentTask.title}: ${step.title}: ${summary}`)
      }
    }
  }

  const built = entries.reduce(
    (count, entry) => count + (entry.container_image?.built ? 1 : 0) + (entry.isolation_image.built ? 1 : 0),
    0,
  )
  return {images: entries, built}
}
