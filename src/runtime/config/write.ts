import fs from 'node:fs'
import path from 'node:path'
import YAML, {isMap, type Document} from 'yaml'
import {GatewayError} from '../util/errors.js'
import {writeWholeFile, type WholeFileOptions} from '../util/write-whole-file.js'
import {parseConfigText} from './load.js'
import type {GatewayConfig} from './types.js'

/** A path into config.yaml: `['agents', 0, 'file_access', 'deny']`. */
export type ConfigPath = ReadonlyArray<string | number>

/** One change to config.yaml: set a value (objects and arrays replace what was there) or remove a key. */
export type ConfigEdit = {path: ConfigPath; value: unknown} | {path: ConfigPath; delete: true}

/** writeWholeFile (util/), its failure said as a config error. */
export function writeFileAtomic(
  file: string,
  content: string,
  options: Pick<WholeFileOptions, 'mode' | 'beforeRename'> = {},
): void {
  try {
    writeWholeFile(file, content, options)
  } catch (error) {
    if (error instanceof GatewayError) throw error
    throw new GatewayError('E_CONFIG', `cannot write ${file}: ${(error as Error).message}`, {
      cause: error,
      suggestions: [`check that ${path.dirname(file)} is writable by this user and the disk is not full`],
    })
  }
}

/**
 * Applies edits to config.yaml text through the `yaml` Document API, so comments and layout of
 * everything not edited survive (a plain parse + stringify would drop every comment).
 */
export function applyConfigEdits(text: string, edits: ReadonlyArray<ConfigEdit>): string {
  const document = YAML.parseDocument(text)
  if (document.errors.length > 0) {
    throw new GatewayError(
      'E_CONFIG',
      `config.yaml does not parse, so it cannot be edited: ${document.errors[0]?.message.split('\n')[0]}`,
      {
        suggestions: ['fix the file by hand (meepagateway config check names the problem)'],
      },
    )
  }
  for (const edit of edits) {
    if ('delete' in edit) {
      if (document.hasIn(edit.path)) document.deleteIn(edit.path)
      continue
    }
    ensureParentMaps(document, edit.path)
    const node = document.createNode(edit.value)
    // a trailing `# e.g. [git, python3]` belongs to the field, not to the old value: keep it
    const previous = document.getIn(edit.path, true)
    if (YAML.isNode(previous)) {
      const old = previous as {comment?: string | null; commentBefore?: string | null; flow?: boolean}
      if (old.comment) node.comment = old.comment
      if (old.commentBefore) node.commentBefore = old.commentBefore
      // `packages: [a, b]` stays on one line when it was written that way
      if (old.flow && YAML.isCollection(node)) node.flow = true
    }
    document.setIn(edit.path, node)
  }
  return document.toString()
}

/** `setIn` creates missing maps itself, but not when a parent exists as a null scalar (`file_access:`). */
function ensureParentMaps(document: Document, at: ConfigPath): void {
  for (let depth = 1; depth < at.length; depth++) {
    const parent = at.slice(0, depth)
    const node = document.getIn(parent, true)
    if (node === undefined || isMap(node) || typeof at[depth] === 'number') continue
    if (YAML.isScalar(node) && (node.value === null || node.value === undefined))
      document.setIn(parent, document.createNode({}))
  }
}

/**
 * Flattens a partial object into leaf edits below `base`: nested objects merge key by key (so
 * untouched keys keep their comments), arrays and scalars replace, `null` removes the key.
 */
export function patchToEdits(base: ConfigPath, patch: Record<string, unknown>): ConfigEdit[] {
  const edits: ConfigEdit[] = []
  for (const [key, value] of Object.entries(patch)) {
    const at = [...base, key]
    if (value === null) edits.push({path: at, delete: true})
    else if (typeof value === 'object' && !Array.isArray(value) && Object.keys(value as object).length > 0) {
      edits.push(...patchToEdits(at, value as Record<string, unknown>))
    } else edits.push({path: at, value})
  }
  return edits
}

export interface ConfigFileUpdate {
  text: string
  config: GatewayConfig
  secrets: Record<string, string>
}

/**
 * Reads config.yaml, applies the edits, validates the result with the same schema and checks as
 * `loadConfig`, and only then writes it atomically. An invalid change throws E_CONFIG naming
 * every problem, and the file is left untouched. `checkRead` sees the text read and may refuse it
 * (a gateway that must not carry along a hand edit it has not applied).
 */
export function updateConfigFile(
  configPath: string,
  edits: ReadonlyArray<ConfigEdit>,
  options: {
    env?: NodeJS.ProcessEnv
    beforeRename?: (tempPath: string) => void
    checkRead?: (text: string) => void
  } = {},
): ConfigFileUpdate {
  let current: string
  try {
    current = fs.readFileSync(configPath, 'utf8')
  } catch (error) {
    throw new GatewayError('E_CONFIG', `cannot read ${configPath}: ${(error as Error).message}`, {cause: error})
  }
  options.checkRead?.(current)
  const text = applyConfigEdits(current, edits)
  const parsed = parseConfigText(text, configPath, options.env ?? process.env)
  if (text !== current) writeFileAtomic(configPath, text, {beforeRename: options.beforeRename})
  return {text, ...parsed}
}
