import {execa} from 'execa'
import fs from 'node:fs'
import os from 'node:os'
import path from 'node:path'
import YAML from 'yaml'
import {fileURLToPath} from 'node:url'

/**
 * A throwaway MEEPAGATEWAY_HOME whose config.yaml has one OpenAI-compatible provider, the fake LLM
 * at `baseUrl` (key in FAKE_LLM_KEY), and `rest` (agents, captain, gateway...).
 */
export function fakeLlmHome(
  prefix: string,
  baseUrl: string,
  rest: Record<string, unknown>,
): {home: string; configPath: string} {
  const home = fs.mkdtempSync(path.join(os.tmpdir(), prefix))
  const configPath = path.join(home, 'config.yaml')
  const providers = {
    primary: 'fake',
    providers: {fake: {kind: 'openai', api_key_env: 'FAKE_LLM_KEY', model: 'fake', base_url: baseUrl}},
  }
  fs.writeFileSync(configPath, YAML.stringify({providers, ...rest}))
  return {home, configPath}
}

/** Removes a benchmark's home; under a root gateway each workspace is a mounted volume of its own: unmounted first. */
export async function removeHome(dir: string): Promise<void> {
  const mounts = fs.readFileSync('/proc/self/mountinfo', 'utf8').split('\n')
  for (const point of mounts.map((line) => line.split(' ')[4]).filter((point) => point?.startsWith(`${dir}/`)))
    await execa('umount', ['-l', point as string], {reject: false})
  fs.rmSync(dir, {recursive: true, force: true})
}

export const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..')

export interface Stats {
  n: number
  median: number
  p95: number
  min: number
  max: number
}

export function stats(samples: number[]): Stats {
  const sorted = [...samples].sort((a, b) => a - b)
  const at = (q: number) => sorted[Math.min(sorted.length - 1, Math.floor(q * sorted.length))] as number
  return {n: sorted.length, median: at(0.5), p95: at(0.95), min: sorted[0] as number, max: sorted.at(-1) as number}
}

/** Runs `fn` n times after `warmup` discarded runs; returns the milliseconds of each. */
export async function sample(n: number, fn: () => Promise<number | void>, warmup = 2): Promise<number[]> {
  const out: number[] = []
  for (let i = 0; i < warmup + n; i++) {
    const started = performance.now()
    const measured = await fn()
    const ms = typeof measured === 'number' ? measured : performance.now() - started
    if (i >= warmup) out.push(ms)
  }
  return out
}

export const fmt = (ms: number) => `${ms.toFixed(1)} ms`

/** Saves machine-readable results beside the benchmark and prints them. */
export function report(name: string, result: Record<string, unknown>): void {
  const dir = path.join(ROOT, 'bench', 'results')
  fs.mkdirSync(dir, {recursive: true})
  const record = {name, date: new Date().toISOString(), node: process.version, ...result}
  fs.writeFileSync(path.join(dir, `${name}.json`), `${JSON.stringify(record, null, 2)}\n`)
  console.log(JSON.stringify(record, null, 2))
}

/** A bench config's `providers`: one fake OpenAI-compatible provider at `baseUrl` (key in FAKE_LLM_KEY). */
export function fakeProviders(baseUrl: string): Record<string, unknown> {
  return {
    primary: 'fake',
    providers: {fake: {kind: 'openai', api_key_env: 'FAKE_LLM_KEY', model: 'fake', base_url: baseUrl}},
  }
}
