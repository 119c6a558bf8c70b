import {format, inspect} from 'node:util'
import {CLIError, colorizeJson} from './oclif-output.js'
import {DeferToOclif, parseArgv, type LiteArg, type LiteFlag} from './parse.js'
import {writeToFd} from './write.js'

/**
 * What `@oclif/core` is inside the lite CLI bundle (scripts/bundle-cli.js aliases it): the parts
 * of its Command, Flags, Args and Errors our commands use, behaving as oclif's do — the same
 * life cycle (init → run → catch → finally, then the JSON result), the same output calls, the
 * same JSON and error printing (copies of oclif's printers, oclif-output.ts). oclif's start-up
 * (its config, plugins, manifest and ~100 modules) is what this leaves out. Argv it does not
 * fully understand never reaches run(): see parse.ts.
 */

const BIN = 'meepagateway'
/** oclif's scoped variables (`<BIN>_<NAME>`). */
const scopedEnv = (name: string) => process.env[`${BIN.toUpperCase()}_${name}`]

export interface LiteConfig {
  bin: string
}

type FlagOptions = Partial<Omit<LiteFlag, 'kind' | 'type'>>

export const Flags = {
  string: (options: FlagOptions = {}): LiteFlag => ({...options, kind: 'string', type: 'option'}),
  integer: (options: FlagOptions = {}): LiteFlag => ({...options, kind: 'integer', type: 'option'}),
  boolean: (options: FlagOptions = {}): LiteFlag => ({...options, kind: 'boolean', type: 'boolean'}),
}

export const Args = {
  string: (options: Partial<Omit<LiteArg, 'kind'>> = {}): LiteArg => ({...options, kind: 'string'}),
}

export const Errors = {CLIError}

/** Type-only in our commands (`Interfaces.InferredFlags`); nothing at run time. */
export const Interfaces = {}

export abstract class Command {
  static args: Record<string, LiteArg> = {}
  static baseFlags: Record<string, LiteFlag> = {}
  static enableJsonFlag = false
  static flags: Record<string, LiteFlag> = {}
  static strict = true
  static id: string
  static summary?: string
  static description?: string
  static examples?: string[]

  id: string

  constructor(
    public argv: string[],
    public config: LiteConfig,
  ) {
    this.id = this.ctor.id
  }

  get ctor(): typeof Command {
    return this.constructor as typeof Command
  }

  abstract run(): Promise<unknown>

  /** oclif's Command._run, with DeferToOclif let through before run() starts. */
  async _run(): Promise<unknown> {
    let err: Error | undefined
    let result: unknown
    try {
      delete process.env[`${BIN.toUpperCase()}_REDIRECTED`]
      await this.init()
      result = await this.run()
    } catch (error) {
      if (error instanceof DeferToOclif) throw error
      err = error as Error
      await this.catch(error as Error & {exitCode?: number})
    } finally {
      await this.finally(err)
    }
    if (result && this.jsonEnabled()) this.logJson(this.toSuccessJson(result))
    return result
  }

  async init(): Promise<void> {}

  async finally(_error: Error | undefined): Promise<void> {}

  async parse(options: {
    flags?: Record<string, LiteFlag>
    baseFlags?: Record<string, LiteFlag>
    args?: Record<string, LiteArg>
    enableJsonFlag?: boolean
    strict?: boolean
  }): Promise<{flags: Record<string, unknown>; args: Record<string, unknown>}> {
    // oclif's aggregateFlags: the JSON flag, then the base flags, then the command's own
    const json: Record<string, LiteFlag> = options.enableJsonFlag
      ? {json: Flags.boolean({description: 'Format output as json.', helpGroup: 'GLOBAL'})}
      : {}
    return parseArgv(this.argv, {
      flags: {...json, ...options.baseFlags, ...options.flags},
      args: options.args ?? {},
      strict: options.strict ?? true,
    })
  }

  async catch(err: Error & {exitCode?: number}): Promise<unknown> {
    process.exitCode = process.exitCode ?? err.exitCode ?? 1
    if (this.jsonEnabled()) {
      this.logJson(this.toErrorJson(err))
      return undefined
    }
    throw err
  }

  jsonEnabled(): boolean {
    if (!this.ctor.enableJsonFlag) return false
    if (scopedEnv('CONTENT_TYPE')?.toLowerCase() === 'json') return true
    const passThroughIndex = this.argv.indexOf('--')
    const jsonIndex = this.argv.indexOf('--json')
    return passThroughIndex === -1 ? jsonIndex !== -1 : jsonIndex !== -1 && jsonIndex < passThroughIndex
  }

  log(message: unknown = '', ...args: unknown[]): void {
    if (!this.jsonEnabled()) writeLine(1, typeof message === 'string' ? message : inspect(message), args)
  }

  logToStderr(message: unknown = '', ...args: unknown[]): void {
    if (!this.jsonEnabled()) writeLine(2, typeof message === 'string' ? message : inspect(message), args)
  }

  logJson(json: unknown): void {
    writeLine(1, colorizeJson(json, {pretty: true}), [])
  }

  toErrorJson(err: unknown): unknown {
    return err instanceof Error ? {error: {...err, message: err.message, name: err.name}} : {error: err}
  }

  toSuccessJson(result: unknown): unknown {
    return result
  }
}

/** oclif's ux.stdout / ux.stderr (console.log / console.error of util.format). */
function writeLine(fd: 1 | 2, message: string, args: unknown[]): void {
  writeToFd(fd, `${message ? format(message, ...args) : format(...args)}\n`)
}
