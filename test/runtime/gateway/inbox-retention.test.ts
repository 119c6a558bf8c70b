import fs from 'node:fs'
import os from 'node:os'
import path from 'node:path'
import {afterEach, describe, expect, it} from 'vitest'
import type {TestHome} from '../../helpers/home.js'
import {closeAfterEachTest, startTestGateway} from './helpers.js'

// A real gateway cleaning an agent's inbox at start, in a workspace the agent has been playing in:
// links planted where folders were, inside old folders, and in place of the inbox itself.
const closeAfterTest = closeAfterEachTest()
const outsides: string[] = []
afterEach(() => {
  for (const dir of outsides.splice(0)) fs.rmSync(dir, {recursive: true, force: true})
})

const DAY_MS = 24 * 60 * 60_000
const longAgo = new Date(Date.now() - 3 * DAY_MS)

/** A folder of the host's, outside every workspace, holding what must survive: a file and an old folder. */
function hostFolder(): string {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'meepa-host-'))
  outsides.push(dir)
  fs.writeFileSync(path.join(dir, 'keep.txt'), 'host data')
  fs.mkdirSync(path.join(dir, 'old-msg'))
  fs.writeFileSync(path.join(dir, 'old-msg', 'keep.txt'), 'host data')
  fs.utimesSync(path.join(dir, 'old-msg'), longAgo, longAgo)
  fs.utimesSync(dir, longAgo, longAgo) // as old as a message folder: only being a link keeps it out
  return dir
}

function expectHostFolderWhole(dir: string): void {
  expect(fs.readFileSync(path.join(dir, 'keep.txt'), 'utf8')).toBe('host data')
  expect(fs.readFileSync(path.join(dir, 'old-msg', 'keep.txt'), 'utf8')).toBe('host data')
}

function gatewayKeepingDays(days: number, prepare: (home: TestHome) => void) {
  return startTestGateway({agents: [{id: 'a', attachments: {inbox_retention_days: days}}], beforeStart: prepare})
}

describe('inbox retention (attachments.inbox_retention_days)', () => {
  it('removes the message folders past the retention, keeps newer ones, and follows no link the agent planted', async () => {
    const host = hostFolder()
    let inbox = ''
    const gateway = closeAfterTest(
      await gatewayKeepingDays(2, (home) => {
        inbox = path.join(home.workspace('a'), 'inbox')
        const old = path.join(inbox, 'old-msg')
        fs.mkdirSync(old, {recursive: true})
        fs.writeFileSync(path.join(old, 'log.txt'), 'received')
        fs.symlinkSync(host, path.join(old, 'into-host'))
        fs.symlinkSync(path.join(host, 'keep.txt'), path.join(old, 'host-file'))
        fs.utimesSync(old, longAgo, longAgo)
        fs.mkdirSync(path.join(inbox, 'new-msg'))
        fs.writeFileSync(path.join(inbox, 'new-msg', 'today.txt'), 'received')
        // an old "message folder" that is a link to the host's folder
        fs.symlinkSync(host, path.join(inbox, 'linked-msg'))
        fs.lutimesSync(path.join(inbox, 'linked-msg'), longAgo, longAgo)
      }),
    )
    await gateway.waitForLog(/agent a: removed 1 inbox folder\(s\) older than 2 day\(s\)/)
    expect(fs.readdirSync(inbox).sort()).toEqual(['linked-msg', 'new-msg'])
    expect(fs.readFileSync(path.join(inbox, 'new-msg', 'today.txt'), 'utf8')).toBe('received')
    expectHostFolderWhole(host)
  })

  it('leaves alone an inbox the agent replaced by a link', async () => {
    const host = hostFolder()
    const gateway = closeAfterTest(
      await gatewayKeepingDays(1, (home) => {
        fs.mkdirSync(home.workspace('a'), {recursive: true})
        fs.symlinkSync(host, path.join(home.workspace('a'), 'inbox'))
      }),
    )
    await gateway.waitForLog(/agent a: could not clean its inbox: its inbox is not a folder/)
    expectHostFolderWhole(host)
  })
})
