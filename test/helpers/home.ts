import {execa} from 'execa'
import {spawnSync} from 'node:child_process'
import fs from 'node:fs'
import os from 'node:os'
import path from 'node:path'
import {fileURLToPath} from 'node:url'
import YAML from 'yaml'

export const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..', '..')
export const BIN = path.join(ROOT, 'bin', 'run.js')

export interface TestHome {
  home: string
  configPath: string
  writeConfig(config: unknown): void
  workspace(agentId: string): string
  cleanup(): void
}

/** A throwaway MEEPAGATEWAY_HOME; pass a config object (written as YAML) or text, and where to make it. */
export function makeHome(config?: unknown, under = os.tmpdir()): TestHome {
  const home = fs.mkdtempSync(path.join(under, 'meepa-home-'))
  const configPath = path.join(home, 'config.yaml')
  const writeConfig = (value: unknown) =>
    fs.writeFileSync(configPath, typeof value === 'string' ? value : YAML.stringify(value))
  if (config !== undefined) writeConfig(config)
  return {
    home,
    configPath,
    writeConfig,
    workspace: (agentId) => path.join(home, 'agents', agentId),
    cleanup: () => fs.rmSync(home, {recursive: true, force: true}), // unmounts first (test/setup/unmount-volumes.ts)
  }
}

/** Bytes in use on the filesystem holding `dir` (a workspace under a root gateway: its volume). */
export function usedBytes(dir: string): number {
  const stat = fs.statfsSync(dir)
  return (stat.blocks - stat.bfree) * stat.bsize
}

/**
 * Unmounts every filesystem mounted below `dir`, deepest first: a root gateway mounts each
 * workspace's volume (src/runtime/workspace/volume.ts), and its loop device goes with the mount.
 * Lazily: a run still being torn down must not keep its home from being removed.
 */
export function unmountBelow(dir: string): void {
  let table: string
  try {
    table = fs.readFileSync('/proc/self/mountinfo', 'utf8')
  } catch {
    return
  }
  const below = table
    .split('\n')
    .map((line) =>
      line.split(' ')[4]?.replace(/\\([0-7]{3})/g, (_, octal: string) => String.fromCharCode(parseInt(octal, 8))),
    )
    .filter((mountPoint): mountPoint is string => mountPoint !== undefined && mountPoint.startsWith(`${dir}/`))
    .sort((a, b) => b.length - a.length)
  for (const mountPoint of below) spawnSync('umount', ['--lazy', mountPoint], {stdio: 'ignore'})
}

/** A config with one OpenAI-compatible provider pointed at a fake LLM and the given agents. */
export function fakeLlmConfig(
  baseUrl: string,
  agents: Array<Record<string, unknown>>,
  extra: Record<string, unknown> = {},
): Record<string, unknown> {
  return {
    providers: {
      primary: 'fake',
      providers: {fake: {kind: 'openai', api_key_env: 'FAKE_LLM_KEY', model: 'fake-model', base_url: baseUrl}},
    },
    agents,
    ...extra,
  }
}

export interface CliResult {
  stdout: string
  stderr: string
  exitCode: number
}

/** Runs the real built CLI as a user would (tests' globalSetup builds dist/ first). */
export async function runCli(
  args: string[],
  options: {home: string; env?: Record<string, string>; input?: string; timeoutMs?: number},
): Promise<CliResult> {
  const result = await execa(process.execPath, [BIN, ...args], {
    env: {
      MEEPAGATEWAY_HOME: options.home,
      FAKE_LLM_KEY: 'sk-fake-test-key-123456',
      MEEPA_RETRY_BASE_MS: '20',
      ...options.env,
    },
    input: options.input ?? '',
    reject: false,
    timeout: options.timeoutMs ?? 60_000,
  })
  return {stdout: String(result.stdout), stderr: String(result.stderr), exitCode: result.exitCode ?? -1}
}
