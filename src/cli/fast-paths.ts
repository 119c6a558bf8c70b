import fs from 'node:fs'
import path from 'node:path'
import {colourError} from './colour.js'
import {CLIError} from './lite/oclif-output.js'
import {exitLikeOclif, oclifPrintsOtherwise} from './lite/run.js'
import {GatewayError} from '../runtime/util/errors.js'
import {defaultConfigPath, gatewayHome} from '../runtime/util/paths.js'

/**
 * Commands that start without oclif when their argv is plain: `sandbox exec` exists to run one
 * command under an agent's policy, and oclif's start-up (its core, config and manifest) would
 * cost more than the sandbox itself. Anything else — `--help`, an unknown or malformed flag, a
 * missing config, an error before the command starts — returns undefined and bin/run.js runs the
 * same argv through oclif, which prints help and errors the usual way.
 */

/** `sandbox exec`'s flags (src/commands/sandbox/exec.ts); test/cli/fast-paths.test.ts keeps them in step. */
export const SANDBOX_EXEC_FLAGS = {
  agent: {char: 'a', type: 'string'},
  timeout: {type: 'integer'},
  config: {type: 'string'},
  'no-color': {type: 'boolean'},
} as const
const DEFAULT_TIMEOUT_SECONDS = 3600

export interface SandboxExecArgv {
  agent: string
  timeoutSeconds: number
  config?: string
  noColor?: boolean
  command: string[]
}

/** Flags, then `--`, then the command exactly as typed; undefined for anything else. */
export function parseSandboxExecArgv(argv: readonly string[]): SandboxExecArgv | undefined {
  const separator = argv.indexOf('--')
  if (separator < 0 || separator === argv.length - 1) return undefined
  const values: Partial<Record<keyof typeof SANDBOX_EXEC_FLAGS, string>> = {}
  const flags = argv.slice(0, separator)
  for (let i = 0; i < flags.length; i++) {
    const token = flags[i] as string
    const long = /^--([a-z-]+)(?:=(.*))?$/.exec(token)
    const short = /^-([a-z])(.*)$/.exec(token)
    const name = long
      ? long[1]
      : Object.entries(SANDBOX_EXEC_FLAGS).find(([, flag]) => 'char' in flag && flag.char === short?.[1])?.[0]
    if (!name || !(name in SANDBOX_EXEC_FLAGS) || (!long && !short)) return undefined
    const inline = long ? long[2] : short?.[2] || undefined
    if (SANDBOX_EXEC_FLAGS[name as keyof typeof SANDBOX_EXEC_FLAGS].type === 'boolean') {
      if (inline !== undefined || values[name as keyof typeof SANDBOX_EXEC_FLAGS] !== undefined) return undefined
      values[name as keyof typeof SANDBOX_EXEC_FLAGS] = 'true'
      continue
    }
    if (!long && inline?.startsWith('=')) return undefined
    const value = inline ?? flags[++i]
    if (value === undefined || value === '' || (inline === undefined && value.startsWith('-'))) return undefined
    if (values[name as keyof typeof SANDBOX_EXEC_FLAGS] !== undefined) return undefined // repeated: let oclif decide
    values[name as keyof typeof SANDBOX_EXEC_FLAGS] = value
  }
  if (!values.agent) return undefined
  if (values.timeout !== undefined && !/^\d+$/.test(values.timeout)) return undefined
  const timeoutSeconds = values.timeout === undefined ? DEFAULT_TIMEOUT_SECONDS : Number(values.timeout)
  if (timeoutSeconds < 1) return undefined
  return {
    agent: values.agent,
    timeoutSeconds,
    ...(values.config ? {config: values.config} : {}),
    ...(values['no-color'] ? {noColor: true} : {}),
    command: argv.slice(separator + 1),
  }
}

/** Runs `sandbox exec` without oclif and returns the exit status, or undefined to hand the argv to oclif. */
export async function sandboxExecWithoutOclif(argv: readonly string[]): Promise<number | undefined> {
  const parsed = parseSandboxExecArgv(argv)
  if (!parsed || oclifPrintsOtherwise()) return undefined
  // a first run writes the default config and says so: that is oclif's path
  const configPath = parsed.config ? path.resolve(parsed.config) : defaultConfigPath(gatewayHome())
  if (!fs.existsSync(configPath)) return undefined
  const [{loadConfig}, {sandboxExec}] = await Promise.all([
    import('../runtime/config/load.js'),
    import('../runtime/host-sandbox/exec.js'),
  ])
  let result: {exitCode: number; timedOut: boolean}
  let started = false
  try {
    result = await sandboxExec({
      loaded: loadConfig({configPath}),
      agentId: parsed.agent,
      argv: parsed.command,
      timeoutMs: parsed.timeoutSeconds * 1000,
      onLog: (line) => process.stderr.write(`${line}\n`),
      onStart: () => {
        started = true
      },
    })
  } catch (error) {
    // an error before the command starts (bad config, unknown agent, a policy this kernel cannot
    // enforce): oclif reports it, and the command has not run
    if (!started) return undefined
    // after it started (say its temporary directory cannot be removed): oclif would run it a second
    // time, so report it here the way oclif does (BaseCommand.catch, then oclif's handle)
    return exitLikeOclif(await colourError(asCliError(error as Error), parsed.noColor ?? false))
  }
  if (result.timedOut)
    process.stderr.write(`sandbox exec: the command ran longer than ${parsed.timeoutSeconds} s and was killed\n`)
  return result.exitCode
}

/**
 * The CLIError oclif prints for an error of `sandbox exec` (toCliError in
 * src/commands/base-command.ts, which cli/ may not import).
 */
function asCliError(error: Error): Error & {oclif?: {exit?: number}} {
  if (error instanceof GatewayError)
    return new CLIError(error.message, {code: error.code, exit: error.exitCode, suggestions: error.suggestions})
  if (error instanceof CLIError) return Object.assign(error, {code: error.code ?? 'E_USAGE'})
  return new CLIError(error.message, {code: 'E_INTERNAL', exit: 1})
}
