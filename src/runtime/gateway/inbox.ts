import {attachmentCaps, describeSize} from '../config/attachment-caps.js'
import {findAgent} from '../config/load.js'
import {sizeBytes} from '../config/size.js'
import type {LoadedConfig} from '../config/types.js'
import {
  notReceived,
  receiveFiles,
  sanitiseContentType,
  sanitiseFileName,
  type DiskRoom,
  type IncomingFile,
} from '../connectors/attachments.js'
import {diskUsage, type DiskUsage} from '../run-lifecycle/disk-limit.js'
import type {MessageAttachment} from '../shapes/agent-run-contract.js'
import {readyWorkspace} from '../workspace/workspace.js'

/**
 * A message's files into its agent's workspace (`inbox/<message id>/`), under the agent's
 * `attachments` caps and within what its `limits.disk` leaves, before its run starts: the gateway
 * downloads, so a run without network still gets them. An agent the config no longer has gets its
 * files listed as skipped (its run fails anyway).
 */
export async function receiveInbox(
  loaded: LoadedConfig,
  agentId: string,
  messageId: string,
  files: IncomingFile[],
  signal: AbortSignal,
  log: (line: string) => void,
): Promise<MessageAttachment[]> {
  let workspace: string
  let caps: ReturnType<typeof attachmentCaps>
  let disk: DiskRoom
  try {
    const agent = findAgent(loaded, agentId)
    caps = attachmentCaps(agent.attachments)
    // its volume mounted first: files written under an unmounted one would be hidden, then refused
    workspace = (await readyWorkspace(loaded.home, agent.id, agent.limits.disk)).path
    // measured before anything is received: where limits.disk is a measurement, not a filesystem
    // of its own, nothing else would stop a workspace at its limit taking file after file
    const limitBytes = sizeBytes(agent.limits.disk, 'limits.disk')
    const usage = await diskUsage([workspace], limitBytes, signal).catch((error: Error): DiskUsage => ({
      bytes: 0,
      error: error.message,
    }))
    signal.throwIfAborted()
    disk = diskRoom(usage, limitBytes, log)
  } catch (error) {
    if (signal.aborted) throw error
    return files.map((file) => {
      const name = sanitiseFileName(file.name)
      return {
        name,
        content_type: sanitiseContentType(file.contentType),
        size: file.declaredSize ?? 0,
        skipped: notReceived(name, error, log),
      }
    })
  }
  return receiveFiles(files, {workspace, messageId, caps, disk, log, signal})
}

/** What limits.disk leaves the workspace, and what the user is told of a file that does not fit. */
function diskRoom(usage: DiskUsage, limitBytes: number, log: (line: string) => void): DiskRoom {
  const limit = `limits.disk, ${describeSize(limitBytes)}`
  const fix = "remove files from the agent's workspace or raise its limits.disk, then send the file again"
  if (usage.error !== undefined) {
    // the measurement's own words name host paths: the operator's log has them, the sender does not
    log(`the workspace could not be measured against limits.disk: ${JSON.stringify(usage.error)}`)
    return {
      bytes: 0,
      full: `the agent's workspace could not be measured against its disk limit (${limit}), which counts as full (the gateway's log has the details); ${fix}`,
    }
  }
  return {
    bytes: limitBytes - usage.bytes,
    full: `there is no room for it under the agent's disk limit (${limit}; its workspace already uses at least ${describeSize(usage.bytes)}); ${fix}`,
  }
}
