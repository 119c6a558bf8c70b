import {execa} from 'execa'
import fs from 'node:fs'
import os from 'node:os'
import path from 'node:path'
import {afterEach, beforeEach, describe, expect, it} from 'vitest'
import {HISTORY_LIMIT, openMemory} from '../../../src/runtime/workspace/memory.js'
import {ROOT} from '../../helpers/home.js'

describe('memory.db', () => {
  let dir: string
  beforeEach(() => {
    dir = fs.mkdtempSync(path.join(os.tmpdir(), 'meepa-mem-'))
  })
  afterEach(() => fs.rmSync(dir, {recursive: true, force: true}))

  it('finds stored facts by full-text search, ranks them, and forgets deleted ones', () => {
    const memory = openMemory(dir)
    const kiwi = memory.storeFact('The deploy password rotates every Tuesday')
    memory.storeFact('Alice prefers tea over coffee')
    expect(memory.searchFacts('when does the password rotate?').map((fact) => fact.id)).toEqual([kiwi.id])
    expect(memory.searchFacts('"); DROP TABLE facts; --')).toEqual([]) // user text is never FTS syntax
    expect(memory.deleteFact(kiwi.id)).toBe(true)
    expect(memory.searchFacts('password')).toEqual([])
    expect(memory.deleteFact(kiwi.id)).toBe(false)
    memory.close()
  })

  it('keeps history per channel, bounded, oldest dropped first', () => {
    const memory = openMemory(dir)
    for (let i = 0; i < HISTORY_LIMIT + 10; i++) memory.appendHistory('a', [{role: 'user', content: `a${i}`}])
    memory.appendHistory('b', [{role: 'user', content: 'b0'}])
    const history = memory.history('a')
    expect(history).toHaveLength(HISTORY_LIMIT)
    expect(history[0]).toEqual({role: 'user', content: 'a10'})
    expect(history.at(-1)).toEqual({role: 'user', content: `a${HISTORY_LIMIT + 9}`})
    expect(memory.history('b')).toEqual([{role: 'user', content: 'b0'}])
    memory.close()
  })

  it('never starts a history with an orphaned tool result after trimming', () => {
    const memory = openMemory(dir)
    memory.appendHistory('c', [
      {role: 'assistant', content: '', tool_calls: [{id: 't1', name: 'shell', arguments: {command: 'ls'}}]},
      {role: 'tool', tool_call_id: 't1', name: 'shell', content: 'x'},
      {role: 'user', content: 'hello'},
    ])
    expect(memory.history('c')).toEqual([{role: 'user', content: 'hello'}])
    memory.close()
  })

  it('survives SIGKILL mid-write: the database opens and keeps every committed row', async () => {
    const child = execa(process.execPath, ['--import', 'tsx', path.join(ROOT, 'test/fixtures/memory-writer.ts'), dir], {
      reject: false,
    })
    const committed: number[] = []
    await new Promise<void>((resolve) => {
      child.stdout?.on('data', (chunk: Buffer) => {
        for (const line of chunk.toString().split('\n')) if (line) committed.push(Number(line))
        if (committed.length > 300) resolve()
      })
    })
    child.kill('SIGKILL')
    await child
    expect(fs.existsSync(path.join(dir, 'memory.db-wal'))).toBe(true) // killed with an open WAL
    const memory = openMemory(dir)
    const lastCommitted = Math.max(...committed)
    expect(memory.countFacts()).toBeGreaterThanOrEqual(committed.length)
    expect(memory.searchFacts(`number ${lastCommitted - 1}`).length).toBeGreaterThan(0)
    memory.storeFact('still writable')
    memory.close()
  })
})
