import fs from 'node:fs'
import path from 'node:path'
import type {InboundMessage} from '../shapes/agent-run-contract.js'
import type {AgentConfig} from '../config/types.js'
import type {Skill} from './skills.js'

function readOptional(file: string): string {
  try {
    return fs.readFileSync(file, 'utf8').trim()
  } catch {
    return ''
  }
}

/** SOUL.md, MEMORY.md, the skills' names and descriptions, and where the agent is. */
export function buildSystemPrompt(
  agent: AgentConfig,
  workspace: string,
  skills: Skill[],
  message: InboundMessage,
): string {
  const soul = readOptional(path.join(workspace, 'SOUL.md')) || `You are ${agent.name}, a helpful assistant.`
  const memory = readOptional(path.join(workspace, 'MEMORY.md'))
  const sections = [
    soul,
    `## Context\nYou are the agent "${agent.name}" (id ${agent.id}). Your workspace, which is also your home directory, is ${workspace}. ` +
      `You are talking to ${message.user.name} on ${message.connector} (channel ${message.channel_id}). ` +
      `Use the tools to act: shell, read_file, write_file, list_files, memory_store, memory_search, memory_delete, skill_read. ` +
      `Answer with plain text when you are done.`,
  ]
  if (memory) sections.push(`## MEMORY.md\n${memory}`)
  if (skills.length > 0) {
    sections.push(
      `## Skills\nRead a skill's full instructions with skill_read before using it.\n${skills.map((skill) => `- ${skill.name}: ${skill.description}`).join('\n')}`,
    )
  }
  return sections.join('\n\n')
}
