import {expect} from 'vitest'
import {BASE_IMAGE} from './docker-env.js'
import type {OwnEngine} from './own-engine.js'
import type {ServeProcess} from './serve.js'
import {waitFor} from './wait-for.js'

/** A command of the base image run over an agent's sync volume (at /w) on an engine of the test's own. */
export async function inAgentVolume(engine: OwnEngine, agent: string, command: string, ...args: string[]) {
  const volume = (await engine.docker(['volume', 'ls', '-q'])).stdout
    .split('\n')
    .find((name) => name.endsWith(`-${agent}`))
  if (!volume) throw new Error(`no volume of ${agent} on the engine`)
  return engine.docker(['run', '--rm', '-v', `${volume}:/w`, '--entrypoint', command, BASE_IMAGE, ...args])
}

/**
 * Sends the agent a message that prints its environment and argv and, while it runs there, looks
 * for `key` in the engine's view of its container (inspect: environment, argv, labels), then in
 * the reply and in the agent's volume on that engine.
 */
export async function expectNoKeyOnEngine(serve: ServeProcess, engine: OwnEngine, agent: string, key: string) {
  const running = serve.chat(agent, 'RUN: env && cat /proc/1/cmdline && sleep 3 && echo finished')
  const inspected = await waitFor(
    'the run container on the engine',
    async () => {
      const ids = (await engine.docker(['ps', '-q', '--filter', `label=meepagateway.agent=${agent}`])).stdout.trim()
      if (!ids) return undefined
      // one listed may be gone by the inspect (an earlier run's, a standby discarded): look again
      const seen = (await engine.docker(['inspect', ...ids.split('\n')])).stdout
      return seen.includes('"Image"') && seen
    },
    20_000,
  )
  expect(inspected).toContain('"Image"')
  expect(inspected).not.toContain(key)
  const reply = await running
  expect(reply.reply).toContain('finished')
  expect(reply.reply).not.toContain(key)
  const grep = await inAgentVolume(engine, agent, 'grep', '-r', key, '/w')
  expect(grep.exitCode, grep.stdout).toBe(1) // grep: nothing found
}

/** Whether /healthz says degraded and names the engine down. */
export async function healthzNamesDown(serve: ServeProcess, name: string): Promise<boolean> {
  const health = await serve.healthz()
  return (
    health.body.status === 'degraded' && (health.body.reasons ?? []).some((r) => r.startsWith(`engine ${name} down`))
  )
}

/** Which engine served the last run that logged "running on engine". */
export function lastEngineOf(serve: ServeProcess): string | undefined {
  return [...serve.output().matchAll(/running on engine (\S+)/g)].at(-1)?.[1]
}
