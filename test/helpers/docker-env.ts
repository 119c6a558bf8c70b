import {execa} from 'execa'
import fs from 'node:fs'
import os from 'node:os'
import path from 'node:path'
import {describeRequiring} from './describe-requiring.js'
import {homeLabel} from '../../src/sandbox/docker/home-label.js'

/**
 * Whether this machine can run the container-mode tests: a docker CLI, an engine that answers, and
 * the locally made base image (scripts/ci/docker-up.sh provides all three). Without them the
 * suites skip with a loud message, or fail when MEEPA_REQUIRE_DOCKER=1 (as CI sets).
 */
export const BASE_IMAGE = 'debian:bookworm-slim'

async function probe(): Promise<string | undefined> {
  const version = await execa('docker', ['version', '--format', '{{.Server.Version}}'], {
    reject: false,
    timeout: 15_000,
  })
  if (version.exitCode !== 0)
    return `no Docker engine answers (${String(version.stderr || version.shortMessage).split('\n')[0]})`
  const base = await execa('docker', ['image', 'inspect', BASE_IMAGE], {reject: false, timeout: 15_000})
  if (base.exitCode !== 0) return `the base image ${BASE_IMAGE} is missing`
  return undefined
}

export const dockerMissingReason = await probe()
export const dockerAvailable = dockerMissingReason === undefined

/** `describe` for suites that need the engine: skipped loudly, or failing under MEEPA_REQUIRE_DOCKER=1. */
export function describeWithDocker(name: string, body: () => void): void {
  const missingReason =
    dockerMissingReason &&
    `${dockerMissingReason}; run scripts/ci/docker-up.sh as root to start an engine and make the base image`
  describeRequiring({what: 'Docker', missingReason, requireEnv: 'MEEPA_REQUIRE_DOCKER'}, name, body)
}

/** The real docker CLI's path, for wrappers that record argv and then exec it. */
export function realDockerPath(): string {
  for (const dir of (process.env.PATH ?? '').split(':')) {
    const candidate = path.join(dir, 'docker')
    if (dir && fs.existsSync(candidate)) return candidate
  }
  return 'docker'
}

export interface DockerRecorder {
  /** Put in MEEPAGATEWAY_DOCKER_BIN. */
  bin: string
  /** Every docker invocation so far, as argv arrays. */
  calls(): string[][]
  clear(): void
}

/** A docker wrapper that appends each argv (NUL-separated, one call per line) to a log, then runs docker. */
export function dockerRecorder(dir: string): DockerRecorder {
  const log = path.join(dir, 'docker-calls.log')
  const bin = path.join(dir, 'docker-recording')
  fs.writeFileSync(
    bin,
    `#!/bin/sh\nfor arg in "$@"; do printf '%s\\0' "$arg"; done >> '${log}'\nprintf '\\n' >> '${log}'\nexec '${realDockerPath()}' "$@"\n`,
    {mode: 0o755},
  )
  return {
    bin,
    calls: () =>
      fs.existsSync(log)
        ? fs
            .readFileSync(log, 'utf8')
            .split('\n')
            .filter(Boolean)
            .map((line) => line.split('\0').filter((arg, i, all) => i < all.length - 1 || arg !== ''))
        : [],
    clear: () => fs.rmSync(log, {force: true}),
  }
}

export function tempDir(prefix: string): string {
  return fs.mkdtempSync(path.join(os.tmpdir(), prefix))
}

/** The id of a running standby container of the gateway home `home`, once one runs (30 s at most), else ''. */
export async function runningStandby(home: string): Promise<string> {
  for (let i = 0; i < 150; i++) {
    const {stdout} = await execa('docker', [
      'ps',
      '-q',
      '--filter',
      `label=meepagateway.home=${homeLabel(home)}`,
      '--filter',
      'label=meepagateway.run=standby',
      '--filter',
      'status=running',
    ])
    if (stdout.trim()) return stdout.trim().split('\n')[0]!
    await new Promise((resolve) => setTimeout(resolve, 200))
  }
  return ''
}

/** `docker ps` arguments listing the names of every container of the gateway home `home` (and `filter`). */
export function homeContainersArgs(home: string, filter: string[] = []): string[] {
  return ['ps', '-a', '--format', '{{.Names}}', '--filter', `label=meepagateway.home=${homeLabel(home)}`, ...filter]
}
