import fs from 'node:fs'
import os from 'node:os'
import path from 'node:path'
import {afterEach, beforeEach, describe, expect, it} from 'vitest'
import {resolveAgent} from '../../../src/runtime/config/load.js'
import {deniedToAgent} from '../../../src/runtime/host-sandbox/agent-policy.js'
import {readFilesToSend} from '../../../src/runtime/workspace/files-to-send.js'

const CAPS = {max_file_size: '1k', max_files: 10, max_total_size: '8k', inbox_retention_days: 7}
let base: string
let workspace: string

beforeEach(() => {
  base = fs.realpathSync(fs.mkdtempSync(path.join(os.tmpdir(), 'denied-to-agent-')))
  workspace = path.join(base, 'ws')
  fs.mkdirSync(path.join(workspace, 'keys', 'deep'), {recursive: true})
  fs.writeFileSync(path.join(workspace, 'keys', 'deep', 'api.key'), 'KEY')
  fs.writeFileSync(path.join(workspace, '.env'), 'SECRET')
  fs.writeFileSync(path.join(workspace, 'report.txt'), 'numbers')
})
afterEach(() => fs.rmSync(base, {recursive: true, force: true}))

const sendAs = (deny: string[], ...paths: string[]) => {
  const agent = resolveAgent({id: 'a', file_access: {deny}} as never, {})
  return readFilesToSend(
    workspace,
    paths.map((file) => ({path: file})),
    CAPS,
    deniedToAgent(agent, workspace, base),
  )
}
const COVERED = "the agent's file_access.deny covers it"

describe("send_file never reads what the agent's own file_access.deny covers", () => {
  it('refuses a denied file and anything below a denied folder, and sends the rest', () => {
    const {files, refused} = sendAs(['.env', 'keys'], '.env', 'keys/deep/api.key', './keys//deep/api.key', 'report.txt')
    expect(files.map((file) => file.name)).toEqual(['report.txt'])
    expect(refused).toEqual([
      {name: '.env', reason: COVERED},
      {name: 'api.key', reason: COVERED},
      {name: 'api.key', reason: COVERED},
    ])
  })

  it('covers a folder denied through a link to it, and one denied by its absolute path', () => {
    fs.symlinkSync(path.join(workspace, 'keys'), path.join(base, 'alias'))
    expect(sendAs([path.join(base, 'alias')], 'keys/deep/api.key').refused).toEqual([
      {name: 'api.key', reason: COVERED},
    ])
    expect(sendAs([path.join(workspace, 'keys', 'deep')], 'keys/deep/api.key').refused).toEqual([
      {name: 'api.key', reason: COVERED},
    ])
  })

  it('covers a denied folder reached by another name for the same folder (its identity)', () => {
    // a second mount of the folder would do the same; a bind mount needs root, a rename does not
    const agent = resolveAgent({id: 'a', file_access: {deny: ['keys']}} as never, {})
    const denied = deniedToAgent(agent, workspace, base)
    expect(denied(path.join(workspace, 'keys', 'deep', 'api.key'))).toBe(true)
    fs.renameSync(path.join(workspace, 'keys'), path.join(workspace, 'KEYS'))
    fs.mkdirSync(path.join(workspace, 'keys'))
    // the denied folder's identity was taken at the first question: the renamed one is still it
    expect(denied(path.join(workspace, 'KEYS', 'deep', 'api.key'))).toBe(true)
    expect(denied(path.join(workspace, 'report.txt'))).toBe(false)
  })

  it('an agent without denies sends what it names', () => {
    expect(sendAs([], '.env', 'keys/deep/api.key').files.map((file) => file.data.toString())).toEqual(['SECRET', 'KEY'])
  })
})
