import fs from 'node:fs'
import path from 'node:path'
import {makeDirectories} from '../util/make-directories.js'
import {gatewayRunDir} from '../util/paths.js'
import {processAlive} from '../util/process-alive.js'
import {writeWholeFile} from '../util/write-whole-file.js'

/**
 * Where a serving gateway's HTTP listener is: the port it actually got (with captain.port 0, one
 * chosen at start-up) and the address it bound. `dashboard link` reads it to print a URL that
 * reaches the dashboard.
 */
export interface ListeningRecord {
  pid: number
  bind: string
  port: number
}

export function listeningRecordPath(home: string): string {
  return path.join(gatewayRunDir(home), 'http.json')
}

/** Writes the record of a listener that listens; the function returned removes it, if it is still this process's. */
export function recordListening(home: string, listening: {bind: string; port: number}): () => void {
  const file = listeningRecordPath(home)
  const record: ListeningRecord = {pid: process.pid, bind: listening.bind, port: listening.port}
  makeDirectories(gatewayRunDir(home), 0o700)
  writeWholeFile(file, JSON.stringify(record) + '\n', {mode: 0o600})
  return () => {
    // a later gateway of this home may have written its own by now
    if (readRecord(file)?.pid === process.pid) fs.rmSync(file, {force: true})
  }
}

/** The listener of a gateway of this home that still runs; undefined when none does (or none can be read). */
export function runningListener(home: string): ListeningRecord | undefined {
  const record = readRecord(listeningRecordPath(home))
  return record && processAlive(record.pid) ? record : undefined
}

function readRecord(file: string): ListeningRecord | undefined {
  try {
    const parsed = JSON.parse(fs.readFileSync(file, 'utf8')) as Partial<ListeningRecord>
    const valid =
      Number.isInteger(parsed.pid) &&
      typeof parsed.bind === 'string' &&
      Number.isInteger(parsed.port) &&
      (parsed.port as number) > 0
    return valid ? (parsed as ListeningRecord) : undefined
  } catch {
    return undefined // none, unreadable (a sandboxed caller), or torn by hand
  }
}
