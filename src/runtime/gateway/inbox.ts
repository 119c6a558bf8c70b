import {attachmentCaps} from '../config/attachment-caps.js'
import {findAgent} from '../config/load.js'
import type {LoadedConfig} from '../config/types.js'
import {
  notReceived,
  receiveFiles,
  sanitiseContentType,
  sanitiseFileName,
  type IncomingFile,
} from '../connectors/attachments.js'
import type {MessageAttachment} from '../shapes/agent-run-contract.js'
import {readyWorkspace} from '../workspace/workspace.js'

/**
 * A message's files into its agent's workspace (`inbox/<message id>/`), under the agent's
 * `attachments` caps, before its run starts: the gateway downloads, so a run without network
 * still gets them. An agent the config no longer has gets its files listed as skipped (its run fails anyway).
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
  try {
    const agent = findAgent(loaded, agentId)
    caps = attachmentCaps(agent.attachments)
    // its volume mounted first: files written under an unmounted one would be hidden, then refused
    workspace = (await readyWorkspace(loaded.home, agent.id, agent.limits.disk)).path
  } catch (error) {
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
  return receiveFiles(files, {workspace, messageId, caps, log, signal})
}
