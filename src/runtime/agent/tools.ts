import fs from 'node:fs'
import path from 'node:path'
import type {Memory} from '../workspace/memory.js'
import type {ToolDefinition} from '../shapes/provider-types.js'
import {killProcessTree, killSession, sessionOf} from '../util/process-tree.js'
import {shellArgv} from '../shapes/tool-shell.js'
import {listSkills} from './skills.js'

/** Tool output beyond this is cut, and the result says so: models cope, prompts stay small. */
export const TOOL_OUTPUT_LIMIT = 16_000
const DEFAULT_SHELL_TIMEOUT_SECONDS = 60
const MAX_SHELL_TIMEOUT_SECONDS = 600
const LIST_LIMIT = 500

export interface ToolContext {
  workspace: string
  memory: Memory
  /** Environment of shell commands: agent-run's own (already scrubbed by the runner) with HOME set. */
  env: NodeJS.ProcessEnv
  /** Applied to every tool output before the model or history sees it. */
  redact: (text: string) => string
  signal?: AbortSignal
  /** Workspace-relative paths send_file asked for, in order; the gateway reads them after the run. */
  filesToSend?: string[]
}

export interface ToolResult {
  ok: boolean
  output: string
}

const str = {type: 'string'} as const
export const TOOL_DEFINITIONS: ToolDefinition[] = [
  {
    name: 'shell',
    description: 'Run a shell command (/bin/sh -c) in the workspace. Returns exit code, stdout and stderr.',
    parameters: {
      type: 'object',
      properties: {
        command: str,
        timeout_seconds: {type: 'number', description: `default ${DEFAULT_SHELL_TIMEOUT_SECONDS}`},
      },
      required: ['command'],
    },
  },
  {
    name: 'read_file',
    description: 'Read a text file. Relative paths are inside the workspace.',
    parameters: {type: 'object', properties: {path: str}, required: ['path']},
  },
  {
    name: 'write_file',
    description: 'Write (create or replace) a text file. Relative paths are inside the workspace.',
    parameters: {type: 'object', properties: {path: str, content: str}, required: ['path', 'content']},
  },
  {
    name: 'list_files',
    description: 'List a directory (default: the workspace).',
    parameters: {type: 'object', properties: {path: str}},
  },
  {
    name: 'memory_store',
    description: 'Remember a fact across conversations.',
    parameters: {type: 'object', properties: {content: str}, required: ['content']},
  },
  {
    name: 'memory_search',
    description: 'Full-text search of remembered facts.',
    parameters: {type: 'object', properties: {query: str, limit: {type: 'number'}}, required: ['query']},
  },
  {
    name: 'memory_delete',
    description: 'Forget a remembered fact by its id.',
    parameters: {type: 'object', properties: {id: {type: 'number'}}, required: ['id']},
  },
  {
    name: 'send_file',
    description:
      'Send a file from the workspace to the user with your reply (a report, a plot, a patched config). The path is relative to the workspace; the file is read when your reply is sent, so finish writing it first.',
    parameters: {type: 'object', properties: {path: str}, required: ['path']},
  },
  {
    name: 'skill_read',
    description: 'Read the full instructions of a skill by name.',
    parameters: {type: 'object', properties: {name: str}, required: ['name']},
  },
]

export function capOutput(text: string, limit = TOOL_OUTPUT_LIMIT): string {
  if (text.length <= limit) return text
  const head = Math.floor(limit * 0.75)
  const tail = limit - head
  return `${text.slice(0, head)}\n[... output truncated: ${text.length} characters, showing the first ${head} and the last ${tail} (cap ${limit}) ...]\n${text.slice(-tail)}`
}

class ToolInputError extends Error {}

function requireString(args: Record<string, unknown>, key: string): string {
  const value = args[key]
  if (typeof value !== 'string') throw new ToolInputError(`"${key}" must be a string`)
  return value
}

function resolvePath(workspace: string, target: string): string {
  return path.resolve(workspace, target)
}

export async function runTool(name: string, args: Record<string, unknown>, context: ToolContext): Promise<ToolResult> {
  try {
    const output = await dispatch(name, args, context)
    return {ok: true, output: capOutput(context.redact(output))}
  } catch (error) {
    const message = error instanceof Error ? error.message : String(error)
    return {ok: false, output: capOutput(context.redact(`error: ${message}`))}
  }
}

async function dispatch(name: string, args: Record<string, unknown>, context: ToolContext): Promise<string> {
  const {workspace, memory} = context
  switch (name) {
    case 'shell':
      return runShell(requireString(args, 'command'), args.timeout_seconds, context)
    case 'read_file':
      return fs.readFileSync(resolvePath(workspace, requireString(args, 'path')), 'utf8')
    case 'write_file': {
      const target = resolvePath(workspace, requireString(args, 'path'))
      const content = requireString(args, 'content')
      fs.mkdirSync(path.dirname(target), {recursive: true})
      fs.writeFileSync(target, content)
      return `wrote ${Buffer.byteLength(content)} bytes to ${target}`
    }
    case 'list_files': {
      const target = resolvePath(workspace, typeof args.path === 'string' ? args.path : '.')
      const entries = fs.readdirSync(target, {withFileTypes: true}).sort((a, b) => a.name.localeCompare(b.name))
      const lines = entries.slice(0, LIST_LIMIT).map((entry) => (entry.isDirectory() ? `${entry.name}/` : entry.name))
      if (entries.length > LIST_LIMIT)
        lines.push(`[... ${entries.length - LIST_LIMIT} more entries not shown (cap ${LIST_LIMIT}) ...]`)
      return lines.length > 0 ? lines.join('\n') : '(empty directory)'
    }
    case 'memory_store': {
      const fact = memory.storeFact(context.redact(requireString(args, 'content')))
      return `stored fact ${fact.id}`
    }
    case 'memory_search': {
      const limit = typeof args.limit === 'number' ? args.limit : 5
      const facts = memory.searchFacts(requireString(args, 'query'), limit)
      return facts.length > 0 ? facts.map((fact) => `[${fact.id}] ${fact.content}`).join('\n') : 'no matching facts'
    }
    case 'memory_delete': {
      const id = Number(args.id)
      if (!Number.isInteger(id)) throw new ToolInputError('"id" must be an integer')
      return memory.deleteFact(id) ? `deleted fact ${id}` : `no fact with id ${id}`
    }
    case 'send_file':
      return requestFile(workspace, requireString(args, 'path'), context)
    case 'skill_read': {
      const wanted = requireString(args, 'name')
      const skill = (await listSkills(workspace)).find((candidate) => candidate.name === wanted)
      if (!skill) throw new ToolInputError(`no skill named "${wanted}"`)
      return fs.readFileSync(skill.file, 'utf8')
    }
    default:
      throw new ToolInputError(
        `unknown tool "${name}"; available: ${TOOL_DEFINITIONS.map((tool) => tool.name).join(', ')}`,
      )
  }
}

/**
 * Notes a file for the reply. Only the name is recorded: the gateway opens the file itself after
 * the run, with its own checks (src/runtime/workspace/files.ts); this check just helps the model.
 */
function requestFile(workspace: string, requested: string, context: ToolContext): string {
  const parts = requested.split(/[\\/]+/).filter((part) => part && part !== '.')
  if (path.isAbsolute(requested) || parts.length === 0 || parts.includes('..'))
    throw new ToolInputError(`"${requested}" is not a path inside the workspace; give one relative to it`)
  const relative = parts.join('/')
  const stat = fs.lstatSync(path.join(workspace, relative), {throwIfNoEntry: false})
  if (!stat) throw new ToolInputError(`${relative} does not exist; write it first`)
  if (!stat.isFile()) throw new ToolInputError(`${relative} is not a regular file (links and directories are not sent)`)
  const files = (context.filesToSend ??= [])
  if (!files.includes(relative)) files.push(relative)
  return `${relative} (${stat.size} bytes) will be sent with your reply`
}

async function runShell(command: string, timeout: unknown, context: ToolContext): Promise<string> {
  const seconds = Math.min(
    typeof timeout === 'number' && timeout > 0 ? timeout : DEFAULT_SHELL_TIMEOUT_SECONDS,
    MAX_SHELL_TIMEOUT_SECONDS,
  )
  // inside the host sandbox this goes back through the helper (own process group, network layer)
  const argv = shellArgv(command, context.env)
  const throughHelper = argv[0] !== '/bin/sh'
  // Every runner starts agent-run as a session leader and kills that session at the deadline, so a
  // command must stay in it (no `detached`, which is setsid): a timeout then kills the session's
  // other members. agent-run started by hand (a terminal's session) keeps a group of its own instead.
  const leadsSession = !throughHelper && sessionOf(process.pid) === process.pid
  const [file, ...args] = argv
  // execa is loaded at the first command, not before the input: a waiting agent-run is ≈ 6 MB smaller
  const {startSubprocess} = await import('../util/subprocess.js')
  const child = startSubprocess(file as string, args, {
    cwd: context.workspace,
    env: {...context.env, HOME: context.workspace},
    all: true,
    detached: !throughHelper && !leadsSession,
    signal: context.signal,
    forceKillAfterMs: 5000,
    maxBuffer: 4 * 1024 * 1024,
  })
  let timedOut = false
  const timer = setTimeout(() => {
    timedOut = true
    if (leadsSession) killSession(process.pid)
    else killProcessTree(child.pid)
  }, seconds * 1000)
  const result = await child
  clearTimeout(timer)
  const output = String(result.all ?? '')
  if (timedOut) return `command timed out after ${seconds} s and was killed\n${output}`
  return `exit code: ${result.exitCode ?? `signal ${result.signal ?? 'unknown'}`}\n${output}`
}
