import fs from 'node:fs'
import os from 'node:os'
import path from 'node:path'
import {afterEach, beforeEach, describe, expect, it} from 'vitest'
import {runTool, TOOL_DEFINITIONS, TOOL_OUTPUT_LIMIT, type ToolContext} from '../../../src/runtime/agent/tools.js'
import {openMemory, type Memory} from '../../../src/runtime/workspace/memory.js'
import {redactSecrets} from '../../../src/runtime/util/redact.js'

describe('agent tools', () => {
  let workspace: string
  let memory: Memory
  let context: ToolContext
  beforeEach(() => {
    workspace = fs.mkdtempSync(path.join(os.tmpdir(), 'meepa-tools-'))
    memory = openMemory(workspace)
    context = {
      workspace,
      memory,
      env: {PATH: process.env.PATH},
      redact: (text) => redactSecrets(text, ['hunter2-secret']),
    }
  })
  afterEach(() => {
    memory.close()
    fs.rmSync(workspace, {recursive: true, force: true})
  })

  it('send_file notes a workspace file for the reply once, and refuses what is not one', async () => {
    fs.mkdirSync(path.join(workspace, 'out'))
    fs.writeFileSync(path.join(workspace, 'out', 'plot.png'), 'png')
    fs.symlinkSync('/etc/passwd', path.join(workspace, 'link'))
    const asked: string[] = []
    const withOutbox = {...context, filesToSend: asked}
    expect(await runTool('send_file', {path: './out//plot.png'}, withOutbox)).toEqual({
      ok: true,
      output: 'out/plot.png (3 bytes) will be sent with your reply',
    })
    await runTool('send_file', {path: 'out/plot.png'}, withOutbox)
    for (const [bad, why] of [
      ['../escape', /not a path inside the workspace/],
      ['/etc/passwd', /not a path inside the workspace/],
      ['missing.txt', /does not exist; write it first/],
      ['link', /not a regular file/],
      ['out', /not a regular file/],
    ] as const) {
      const result = await runTool('send_file', {path: bad}, withOutbox)
      expect(result.ok).toBe(false)
      expect(result.output).toMatch(why)
    }
    expect(asked).toEqual(['out/plot.png'])
  })

  it('has exactly the contract tool names', () => {
    expect(TOOL_DEFINITIONS.map((tool) => tool.name)).toEqual([
      'shell',
      'read_file',
      'write_file',
      'list_files',
      'memory_store',
      'memory_search',
      'memory_delete',
      'send_file',
      'skill_read',
    ])
  })

  it('runs shell in the workspace with HOME set to it', async () => {
    const result = await runTool('shell', {command: 'pwd; echo "$HOME"'}, context)
    expect(result).toEqual({ok: true, output: `exit code: 0\n${workspace}\n${workspace}`})
  })

  it('reports a non-zero exit and kills a command past its timeout, with what it started', async () => {
    expect((await runTool('shell', {command: 'exit 3'}, context)).output).toMatch(/^exit code: 3/)
    const sentinel = path.join(workspace, 'late')
    const started = Date.now()
    const result = await runTool(
      'shell',
      {command: `(sleep 2; touch ${sentinel}) & sleep 5`, timeout_seconds: 0.5},
      context,
    )
    expect(Date.now() - started).toBeLessThan(3000)
    expect(result.output).toMatch(/timed out after 0.5 s/)
    await new Promise((resolve) => setTimeout(resolve, 2500))
    expect(fs.existsSync(sentinel)).toBe(false)
  })

  it('returns at once when a process the command left in the background floods past the output cap (no timeout spent at full CPU)', async () => {
    const started = Date.now()
    const result = await runTool('shell', {command: 'yes x & exit 0', timeout_seconds: 10}, context)
    expect(result.output).not.toMatch(/timed out/)
    expect(Date.now() - started).toBeLessThan(5_000)
  })

  it('caps large output and says so', async () => {
    const result = await runTool('shell', {command: 'head -c 100000 /dev/zero | tr "\\0" a'}, context)
    expect(result.output.length).toBeLessThan(TOOL_OUTPUT_LIMIT + 200)
    expect(result.output).toContain(`output truncated: 100013 characters`)
  })

  it('resolves relative paths in the workspace for write, read and list', async () => {
    expect((await runTool('write_file', {path: 'notes/a.txt', content: 'hi'}, context)).ok).toBe(true)
    expect(fs.readFileSync(path.join(workspace, 'notes/a.txt'), 'utf8')).toBe('hi')
    expect(await runTool('read_file', {path: 'notes/a.txt'}, context)).toEqual({ok: true, output: 'hi'})
    expect((await runTool('list_files', {}, context)).output.split('\n')).toEqual(
      expect.arrayContaining(['notes/', 'memory.db']),
    )
  })

  it('returns errors to the model instead of throwing', async () => {
    expect(await runTool('read_file', {path: 'missing.txt'}, context)).toMatchObject({
      ok: false,
      output: expect.stringMatching(/^error: ENOENT/),
    })
    expect(await runTool('read_file', {}, context)).toEqual({ok: false, output: 'error: "path" must be a string'})
    expect((await runTool('rm_rf', {}, context)).output).toMatch(/unknown tool "rm_rf"/)
  })

  it('redacts secrets from tool output', async () => {
    const result = await runTool('shell', {command: 'echo key=hunter2-secret'}, context)
    expect(result.output).toBe('exit code: 0\nkey=[REDACTED]')
  })

  it('stores, searches and deletes memory, and reads skills', async () => {
    expect((await runTool('memory_store', {content: 'the wifi password is in the drawer'}, context)).output).toBe(
      'stored fact 1',
    )
    expect((await runTool('memory_search', {query: 'wifi'}, context)).output).toBe(
      '[1] the wifi password is in the drawer',
    )
    expect((await runTool('memory_delete', {id: 1}, context)).output).toBe('deleted fact 1')
    fs.mkdirSync(path.join(workspace, 'skills/deploy'), {recursive: true})
    fs.writeFileSync(
      path.join(workspace, 'skills/deploy/SKILL.md'),
      '---\nname: deploy\ndescription: ship it\n---\nRun make deploy.',
    )
    expect((await runTool('skill_read', {name: 'deploy'}, context)).output).toContain('Run make deploy.')
    expect((await runTool('skill_read', {name: 'nope'}, context)).ok).toBe(false)
  })
})
