import crypto from 'node:crypto'
import fs from 'node:fs'
import path from 'node:path'
import {engineSyncDir, installIdFile} from '../../runtime/util/paths.js'
import {readRegularFile} from '../../runtime/util/regular-file.js'
import {writeWholeFile} from '../../runtime/util/write-whole-file.js'
import {GatewayError, toGatewayError} from '../../runtime/util/errors.js'
import {sha256} from './dockerfile.js'

/** What install-id says in a home whose objects on engines were named after its path alone. */
const BY_PATH = 'path'

/** Read once per home: every run names its objects with it. */
const ids = new Map<string, string>()

/**
 * The label value that scopes containers and volumes to one MEEPAGATEWAY_HOME (several may share
 * an engine): its path and the random id it keeps, so two gateways whose homes have the same path
 * (two machines, one shared engine) never take each other's objects for their own. A home made
 * before the id keeps a label by path while it has volumes on engines (docs/architecture.md).
 */
export function homeLabel(home: string): string {
  const canonical = canonicalHome(home)
  const id = installId(canonical)
  return sha256(id === BY_PATH ? canonical : `${canonical}\n${id}`).slice(0, 16)
}

/** Whether the home's objects on engines are still named after its path alone (it had volumes there before its id). */
export function labelledByPath(home: string): boolean {
  return installId(canonicalHome(home)) === BY_PATH
}

function canonicalHome(home: string): string {
  const resolved = path.resolve(home)
  try {
    return fs.realpathSync(resolved)
  } catch {
    // a home that does not exist yet is labelled by its resolved path
    return resolved
  }
}

/**
 * The home's install-id, made on first use. A home that does not exist yet holds no objects and
 * is labelled by its path until it does; one whose id can be neither read nor made is refused,
 * never labelled by its path (that label could be another machine's home's).
 */
function installId(home: string): string {
  const known = ids.get(home)
  if (known !== undefined) return known
  const file = installIdFile(home)
  let id = readInstallId(file)
  if (id === undefined) {
    if (!fs.existsSync(home)) return BY_PATH
    const made = namedByPath(home) ? BY_PATH : crypto.randomBytes(16).toString('hex')
    try {
      // two processes of the home may make it at once: the first one put in place is the id
      writeWholeFile(file, `${made}\n`, {exclusive: true, mode: 0o600})
      id = made
    } catch (error) {
      if ((error as NodeJS.ErrnoException).code === 'EEXIST') id = readInstallId(file)
      if (id === undefined) throw unusableInstallId(file, error)
    }
  }
  ids.set(home, id)
  return id
}

function readInstallId(file: string): string | undefined {
  const content = readRegularFile(file, 128)
  if (content !== undefined) {
    const id = content.toString('utf8').trim()
    if (!id) throw unusableInstallId(file, 'it is empty')
    return id
  }
  const stat = fs.lstatSync(file, {throwIfNoEntry: false})
  if (!stat) return undefined
  if (!stat.isFile()) throw unusableInstallId(file, 'it is not a regular file')
  try {
    fs.accessSync(file, fs.constants.R_OK)
  } catch (error) {
    throw unusableInstallId(file, error)
  }
  throw unusableInstallId(file, 'it could not be read')
}

function unusableInstallId(file: string, why: unknown): GatewayError {
  const reason = typeof why === 'string' ? why : toGatewayError(why).message
  return new GatewayError('E_STATE', `cannot use ${file}, this home's id on engines: ${reason}`, {
    suggestions: [
      'run the gateway and its commands as the user that owns the home, with the home writable',
      'put back the regular file the home had there (the objects on engines are named after it)',
    ],
  })
}

/** Whether the home already has volumes on engines named after its path alone (made before the id). */
function namedByPath(home: string): boolean {
  const records = engineSyncDir(home)
  const holds = (dir: string): string[] => {
    try {
      return fs.readdirSync(dir)
    } catch {
      return []
    }
  }
  return holds(records).some((engine) => holds(path.join(records, engine)).some((name) => name.endsWith('.json')))
}
