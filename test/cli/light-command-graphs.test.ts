import {build} from 'esbuild'
import fs from 'node:fs'
import path from 'node:path'
import {ROOT} from '../helpers/home.js'
import {describe, expect, it} from 'vitest'

// issue 13: `config check`, `agent list` and `runs` go into a small start-up bundle of their own;
// everything they import, dynamic imports included (a bundle takes those in too), is in it. execa
// may be in it only behind a dynamic import, evaluated when a host probe runs (once per boot): the
// static graph, what every start evaluates, holds nothing heavy.
const HEAVY = [
  'execa',
  'better-sqlite3',
  '@anthropic-ai/sdk',
  'openai',
  'discord.js',
  '@slack/web-api',
  '@slack/socket-mode',
  'node:crypto',
]
const ONLY_WHEN_PROBING = ['execa']
// Node's network stack: TLS with crypto and the HTTP client cost `config check` ≈ 7 ms at start; a
// probe of an engine loads them when it asks (process.getBuiltinModule)
const NETWORK = ['node:https', 'node:http', 'node:tls', 'node:net']

async function packagesImportedBy(entry: string): Promise<{packages: string[]; atStart: string[]; sources: string[]}> {
  const result = await build({
    entryPoints: [entry],
    bundle: true,
    write: false,
    metafile: true,
    platform: 'node',
    format: 'esm',
    packages: 'external',
    logLevel: 'silent',
  })
  const inputs = result.metafile.inputs
  const packages = new Set<string>()
  for (const input of Object.values(inputs))
    for (const imported of input.imports) if (imported.external) packages.add(imported.path)
  // what a start evaluates: the entry and its static imports, transitively
  const atStart = new Set<string>()
  const seen = new Set<string>()
  const visit = (file: string) => {
    if (seen.has(file)) return
    seen.add(file)
    for (const imported of inputs[file]?.imports ?? []) {
      if (imported.kind !== 'import-statement') continue
      if (imported.external) atStart.add(imported.path)
      else visit(imported.path)
    }
  }
  visit(Object.keys(inputs).find((file) => file.endsWith(entry)) ?? entry)
  return {packages: [...packages].sort(), atStart: [...atStart].sort(), sources: Object.keys(inputs)}
}

describe('the light commands import nothing heavy', () => {
  it.each([
    ['src/commands/config/check.ts', []],
    ['src/commands/agent/list.ts', []],
    ['src/commands/runs.ts', ['better-sqlite3']],
  ])('%s', async (entry, allowed) => {
    const {packages, atStart, sources} = await packagesImportedBy(entry)
    expect(atStart.length).toBeGreaterThan(0)
    expect(atStart.filter((name) => [...HEAVY, ...NETWORK].includes(name) && !allowed.includes(name))).toEqual([])
    expect(
      packages.filter((name) => HEAVY.includes(name) && !allowed.includes(name) && !ONLY_WHEN_PROBING.includes(name)),
    ).toEqual([])
    expect(sources.filter((source) => /\/(runners|run-lifecycle|llm-channel)\//.test(source))).toEqual([])
  })
})

describe("send's start-up bundle", () => {
  it('holds what hands the message to a running gateway, not the one-shot run (a bundle of its own, loaded only when no gateway takes it)', () => {
    const read = (file: string) => fs.readFileSync(path.join(ROOT, 'dist', 'lite', file), 'latin1')
    // (includes(), not toContain(): a failure would print the whole bundle)
    for (const name of ['AgentRunChannel', 'createRunCgroup', 'createProviderChain', 'runMessage']) {
      expect(read('send.cjs').includes(name), name).toBe(false)
      expect(read('send-one-shot.cjs').includes(name), name).toBe(true)
    }
    expect(read('send.cjs').includes('sendThroughGateway')).toBe(true)
    // not a command of its own
    expect(JSON.parse(read('index.json'))).not.toContain('send-one-shot')
  })
})
