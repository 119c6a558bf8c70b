import {runCommand} from '@oclif/test'
import fs from 'node:fs'
import path from 'node:path'
import {execa} from 'execa'
import {pathToFileURL} from 'node:url'
import {afterEach, beforeEach, describe, expect, it} from 'vitest'
import {ensureWorkspace} from '../../../src/runtime/workspace/workspace.js'
import {makeHome, type TestHome} from '../../helpers/home.js'

describe('agent workspaces', () => {
  let home: TestHome
  let saved: string | undefined
  beforeEach(() => {
    home = makeHome()
    saved = process.env.MEEPAGATEWAY_HOME
    process.env.MEEPAGATEWAY_HOME = home.home
  })
  afterEach(() => {
    process.env.MEEPAGATEWAY_HOME = saved
    home.cleanup()
  })

  it("creates SOUL.md, MEMORY.md, memory.db and skills/, and a second create keeps the operator's edits", async () => {
    const first = await runCommand<{created: string[]}>('agent create helper --json')
    expect(first.result?.created.sort()).toEqual(['.', 'MEMORY.md', 'SOUL.md', 'memory.db', 'skills/'])
    const ws = home.workspace('helper')
    fs.writeFileSync(path.join(ws, 'SOUL.md'), 'my own soul')
    const second = await runCommand<{created: string[]; kept: string[]}>('agent create helper --json')
    expect(second.result?.created).toEqual([])
    expect(second.result?.kept.sort()).toEqual(['MEMORY.md', 'SOUL.md', 'memory.db', 'skills/'])
    expect(fs.readFileSync(path.join(ws, 'SOUL.md'), 'utf8')).toBe('my own soul')
  })

  it.each(['../escape', 'a/b', 'UPPER', '-leading', '', 'x'.repeat(64), '..'])(
    'rejects the id %j without touching the disk',
    async (id) => {
      expect(() => ensureWorkspace(home.home, id)).toThrow(/invalid agent id/)
      expect(fs.existsSync(path.join(home.home, 'escape'))).toBe(false)
      expect(fs.existsSync(path.join(home.home, 'agents'))).toBe(false)
    },
  )

  it('exits 2 for an invalid id on the command line', async () => {
    const {error} = await runCommand(['agent', 'create', '../x'])
    expect(error?.oclif?.exit).toBe(2)
  })

  it('lists agents with isolation level and workspace state as JSON', async () => {
    home.writeConfig({
      providers: {primary: 'p', providers: {p: {kind: 'openai', model: 'm'}}},
      agents: [
        {id: 'one'},
        {id: 'two', container_mode: {enabled: true}},
        {id: 'three', file_access: {unrestricted: true}},
      ],
    })
    await runCommand('agent create one')
    const {result} =
      await runCommand<Array<{id: string; isolation: string; workspace_exists: boolean}>>('agent list --json')
    expect(result?.map(({id, isolation, workspace_exists}) => ({id, isolation, workspace_exists}))).toEqual([
      {id: 'one', isolation: 'host-sandbox', workspace_exists: true},
      {id: 'two', isolation: 'container', workspace_exists: false},
      {id: 'three', isolation: 'unrestricted', workspace_exists: false},
    ])
  })

  it('two messages to a new agent at once: both processes create the workspace, neither fails on the other', async () => {
    const built = pathToFileURL(path.resolve('dist/runtime/workspace/workspace.js')).href
    // both processes spin until the same instant, so their checks and creates interleave
    const script = `import {ensureWorkspace} from ${JSON.stringify(built)}; while (Date.now() < Number(process.argv[2])); ensureWorkspace(process.argv[1], 'racer')`
    for (let round = 0; round < 10; round++) {
      fs.rmSync(path.join(home.home, 'agents'), {recursive: true, force: true})
      const at = String(Date.now() + 400)
      const racers = await Promise.all(
        Array.from({length: 2}, () =>
          execa(process.execPath, ['--input-type=module', '-e', script, home.home, at], {reject: false}),
        ),
      )
      expect(
        racers.map((racer) => racer.exitCode),
        racers.map((racer) => racer.stderr).join('\n'),
      ).toEqual([0, 0])
      expect(fs.readdirSync(home.workspace('racer')).sort()).toEqual(['MEMORY.md', 'SOUL.md', 'memory.db', 'skills'])
    }
  })
})
