import {Command, Errors, Flags, type Interfaces} from '@oclif/core'
import {loadConfigForCommand} from '../runtime/config/load.js'
import type {LoadedConfig} from '../runtime/config/types.js'
import {GatewayError} from '../runtime/util/errors.js'
import {argvSaysNoColor, colourError, colours} from '../cli/colour.js'
import type {ChalkInstance} from 'chalk'

export type BaseFlags<T extends typeof Command> = Interfaces.InferredFlags<
  (typeof BaseCommand)['baseFlags'] & T['flags']
>
export type BaseArgs<T extends typeof Command> = Interfaces.InferredArgs<T['args']>

/**
 * Every command: `--json`, `--config`, and one mapping from runtime errors to a message,
 * "Try this:" suggestions and a stable exit code (0 ok, 2 usage, 3+ ours: see src/runtime/util/errors.ts).
 */
export abstract class BaseCommand<T extends typeof Command> extends Command {
  static baseFlags = {
    config: Flags.string({
      description: 'path to config.yaml (default: $MEEPAGATEWAY_HOME/config.yaml)',
      helpGroup: 'GLOBAL',
    }),
    'no-color': Flags.boolean({
      description: 'no colour in the output (also NO_COLOR, or output that is not a terminal)',
      helpGroup: 'GLOBAL',
    }),
  }

  static enableJsonFlag = true

  protected flags!: BaseFlags<T>
  protected args!: BaseArgs<T>

  public async init(): Promise<void> {
    await super.init()
    const {args, flags} = await this.parse({
      args: this.ctor.args,
      baseFlags: (super.ctor as typeof BaseCommand).baseFlags,
      enableJsonFlag: this.ctor.enableJsonFlag,
      flags: this.ctor.flags,
      strict: this.ctor.strict,
    })
    this.flags = flags as BaseFlags<T>
    this.args = args as BaseArgs<T>
  }

  /** chalk for what the command logs on stdout: colours only at a terminal (src/cli/colour.ts). */
  protected colours(): Promise<ChalkInstance> {
    return colours(1, this.noColor())
  }

  private noColor(): boolean {
    return (this.flags as {'no-color'?: boolean} | undefined)?.['no-color'] ?? argvSaysNoColor(this.argv)
  }

  /** Loads the config, writing the commented default on first use and saying so on stderr. */
  protected loadConfig(): LoadedConfig {
    return loadConfigForCommand(this.flags.config, (line) => this.logToStderr(line))
  }

  protected async catch(error: Error & {exitCode?: number}): Promise<unknown> {
    const cliError = toCliError(error)
    if (!this.jsonEnabled()) await colourError(cliError, this.noColor())
    return super.catch(Object.assign(cliError, {exitCode: cliError.oclif.exit}))
  }

  // The stock envelope dumps oclif's whole Config on parse errors; keep it small and stable.
  protected toErrorJson(error: unknown): unknown {
    const cliError = error as Errors.CLIError & {exitCode?: number; details?: Record<string, unknown>}
    return {
      error: {
        code: cliError.code ?? 'E_INTERNAL',
        exitCode: cliError.oclif?.exit ?? 1,
        message: cliError.message,
        suggestions: cliError.suggestions ?? [],
        ...(cliError.details ? {details: cliError.details} : {}),
      },
    }
  }
}

function toCliError(error: Error): Errors.CLIError {
  if (error instanceof GatewayError) {
    return Object.assign(
      new Errors.CLIError(error.message, {code: error.code, exit: error.exitCode, suggestions: error.suggestions}),
      {
        details: Object.keys(error.details).length > 0 ? error.details : undefined,
      },
    )
  }
  if (error instanceof Errors.CLIError) {
    error.code ??= 'E_USAGE'
    return error
  }
  return new Errors.CLIError(error.message, {code: 'E_INTERNAL', exit: 1})
}

/** `--engine NAME` of the `container` commands. */
export const engineFlag = Flags.string({description: 'only this engine of the `engines:` list'})
