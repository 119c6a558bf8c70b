import {attachmentCaps} from '../config/attachment-caps.js'
import {findAgent} from '../config/load.js'
import type {LoadedConfig} from '../config/types.js'
import {receiveFiles, type IncomingFile} from '../connectors/attachments.js'
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
): Promise<MessageAttachment[]> {
  let workspace: string
  let caps: ReturnType<typeof attachmentCaps>
  try {
    const agent = findAgent(loaded, agentId)
    caps = attachmentCaps(agent.attachments)
    // its volume mounted first: files written under an unmounted one would be hidden, then refused
    workspace = (await readyWorkspace(loaded.home, agent.id, agent.limits.disk)).path
  } catch (error) {
    return files.map((file) => ({
      name: file.name,
      content_type: file.contentType ?? 'application/octet-stream',
      size: file.declaredSize ?? 0,
      skipped: `it could not be received: ${(error as Error).message}`,
    }))
  }
  return receiveFiles(files, {workspace, messageId, caps, signal})
}
