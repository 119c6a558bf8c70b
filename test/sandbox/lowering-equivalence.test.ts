import {spawnSync} from 'node:child_process'
import fs from 'node:fs'
import net from 'node:net'
import os from 'node:os'
import path from 'node:path'
import {afterAll, beforeAll, describe, expect, it, onTestFinished} from 'vitest'
import {canonicalEntry, canonicalPath, entryKind, isWithin} from '../../src/sandbox/paths.js'
import {
  type AccessClass,
  compilePolicy,
  lowerToRules,
  type PolicyDeny,
  type PolicyGrant,
} from '../../src/sandbox/policy.js'
import {oracleCanonicalPath, oracleEntryKind, oracleIsWithin, oracleLowerToRules} from './lowering-oracle.js'
import {seededRandom} from '../helpers/seeded-random.js'

// The security compiler's lowering was rewritten for speed: its output must stay exactly the old
// one's, rule for rule and in the same order, over generated trees and the real machine's policies.

// names whose byte order and localeCompare order differ, dotfiles, spaces, a name that is a prefix of another
const NAMES = ['a', 'A', 'ab', 'a b', 'a-b', 'a.b', '.hidden', '_x', 'é', 'z', 'Z', '10', '9', 'b', 'ba']
const ACCESS: AccessClass[] = ['read', 'read-write', 'device-rw', 'device-read', 'pty']

let base: string
beforeAll(() => {
  base = fs.realpathSync(fs.mkdtempSync(path.join(os.tmpdir(), 'meepa-lowering-')))
})
afterAll(() => {
  fs.rmSync(base, {recursive: true, force: true})
})

/** A random tree of directories, files and symlinks (to entries inside, outside, and dangling). */
function generateTree(root: string, rand: () => number): string[] {
  const pick = <T>(items: readonly T[]): T => items[Math.floor(rand() * items.length)] as T
  fs.mkdirSync(root)
  const dirs = [root]
  const entries: string[] = []
  const count = 5 + Math.floor(rand() * 60)
  for (let i = 0; i < count; i++) {
    const entry = path.join(pick(dirs), pick(NAMES))
    if (fs.existsSync(entry) || entryKind(entry) !== 'missing') continue
    const roll = rand()
    if (roll < 0.45) {
      fs.mkdirSync(entry)
      dirs.push(entry)
    } else if (roll < 0.85) fs.writeFileSync(entry, 'x')
    else
      fs.symlinkSync(
        rand() < 0.3 ? '/etc' : rand() < 0.5 && entries.length > 0 ? pick(entries) : path.join(root, 'dangling'),
        entry,
      )
    entries.push(entry)
  }
  return entries
}

function generateCase(root: string, rand: () => number): {grants: PolicyGrant[]; denies: PolicyDeny[]} {
  const pick = <T>(items: readonly T[]): T => items[Math.floor(rand() * items.length)] as T
  const entries = generateTree(root, rand)
  const existing = [root, ...entries]
  // missing entries, deeper paths and a few unnormalised spellings (a trailing slash)
  const candidates = () => {
    const entry = pick(existing)
    const roll = rand()
    if (roll < 0.1) return path.join(entry, pick(NAMES), pick(NAMES))
    if (roll < 0.2) return path.join(entry, 'missing')
    if (roll < 0.25) return `${entry}/`
    return roll < 0.6 ? canonicalPath(entry) : entry
  }
  const grants: PolicyGrant[] = Array.from({length: 1 + Math.floor(rand() * 6)}, (_, i) => ({
    path: rand() < 0.3 ? root : candidates(),
    access: pick(ACCESS),
    reason: `grant ${i % 3}`,
    pinned: rand() < 0.5,
  }))
  const denies: PolicyDeny[] = Array.from({length: Math.floor(rand() * 10)}, (_, i) => {
    const target = candidates()
    return {
      path: target,
      reason: `deny ${i}`,
      source: rand() < 0.5 ? 'config' : 'mandatory',
      exists: entryKind(target) !== 'missing',
    }
  })
  return {grants, denies}
}

describe('canonicalPath and entryKind are exactly the old ones (which built an exception per missing entry)', () => {
  it('on generated trees: missing tails, dangling links, link loops, paths through files', () => {
    const root = path.join(base, 'paths')
    const entries = generateTree(root, seededRandom(7))
    fs.symlinkSync('loop-b', path.join(root, 'loop-a'))
    fs.symlinkSync('loop-a', path.join(root, 'loop-b'))
    fs.writeFileSync(path.join(root, 'plain'), '')
    const probes = [
      root,
      '/',
      '/etc/shadow',
      '/proc/self/fd/0',
      'relative/missing',
      path.join(root, 'loop-a', 'x'),
      path.join(root, 'plain', 'under', 'file'),
    ]
    for (const entry of [...entries, root])
      probes.push(
        entry,
        `${entry}/`,
        path.join(entry, 'missing'),
        path.join(entry, 'missing', 'deeper'),
        path.join(entry, '..', 'x'),
      )
    for (const probe of probes) {
      expect({probe, canonical: canonicalPath(probe), kind: entryKind(probe)}).toEqual({
        probe,
        canonical: oracleCanonicalPath(probe),
        kind: oracleEntryKind(probe),
      })
      expect({probe, entry: canonicalEntry(probe)}).toEqual({
        probe,
        entry: path.join(oracleCanonicalPath(path.dirname(path.resolve(probe))), path.basename(path.resolve(probe))),
      })
    }
  })
})

describe('isWithin is exactly the old one (which built `parent/` for every call)', () => {
  it('on every pair of generated paths, prefixes, trailing slashes and the root', () => {
    const parts = ['', '/', 'a', 'ab', 'a/b', 'a/', '/a', '/a/', '/a/b', '/ab', '/a/bc', '//a', 'a//b', '/a/b/']
    for (const child of parts)
      for (const parent of parts)
        expect([child, parent, isWithin(child, parent)]).toEqual([child, parent, oracleIsWithin(child, parent)])
  })
})

describe('lowerToRules is exactly the old (quadratic) lowering', () => {
  it('on 400 generated trees, grants and denies', () => {
    let lowered = 0
    let rules = 0
    for (let seed = 1; seed <= 400; seed++) {
      const rand = seededRandom(seed)
      const {grants, denies} = generateCase(path.join(base, `case-${seed}`), rand)
      const expected = oracleLowerToRules(grants, denies)
      expect({seed, ...lowerToRules(grants, denies)}).toEqual({seed, ...expected})
      lowered += expected.lowered.length
      rules += expected.rules.length
    }
    // the generator does reach the lowering, not just whole-grant rules
    expect(lowered).toBeGreaterThan(200)
    expect(rules).toBeGreaterThan(2000)
  })

  it('on many denies in one directory (a home with hundreds of dotfiles), a FIFO and a socket among them', async () => {
    const home = path.join(base, 'dotfiles')
    fs.mkdirSync(home)
    // entries that are neither file, directory nor link: typed by the listing, not by lstat
    expect(spawnSync('mkfifo', [path.join(home, 'fifo')]).status).toBe(0)
    const server = net.createServer()
    await new Promise<void>((resolve) => server.listen(path.join(home, 'socket'), resolve))
    onTestFinished(() => void server.close())
    const denies: PolicyDeny[] = []
    for (let i = 0; i < 600; i++) {
      const entry = path.join(home, `.dot${i}`)
      if (i % 3 === 0) fs.mkdirSync(entry)
      else fs.writeFileSync(entry, '')
      if (i % 2 === 0) denies.push({path: entry, reason: 'dotfile', source: 'mandatory', exists: true})
      fs.writeFileSync(path.join(home, `plain${i}`), '')
    }
    denies.push({path: path.join(home, '.dot3', 'deeper', 'missing'), reason: 'deep', source: 'config', exists: false})
    const grants: PolicyGrant[] = [
      {path: home, access: 'read-write', reason: 'home', pinned: false},
      {path: path.join(home, '.dot1'), access: 'read', reason: 'inside a deny', pinned: true},
    ]
    expect(lowerToRules(grants, denies)).toEqual(oracleLowerToRules(grants, denies))
  })

  it("on this machine's agent policies (system directories, /etc's secrets, the operator's dotfiles)", () => {
    const root = path.join(base, 'machine')
    for (const dir of ['gw/agents/me', 'gw/agents/other', 'tmp/run', 'app', 'opHome/.ssh', 'opHome/notes'])
      fs.mkdirSync(path.join(root, dir), {recursive: true})
    fs.writeFileSync(path.join(root, 'gw/config.yaml'), '')
    fs.writeFileSync(path.join(root, 'gw/agents/me/SOUL.md'), '')
    fs.mkdirSync(path.join(root, 'gw/agents/me/.git'))
    const configs = [
      {deny: [], allow_read: [], allow_read_write: []},
      {deny: ['/usr/share/doc', '/etc/ssl', '.git', 'missing/file'], allow_read: ['/opt'], allow_read_write: []},
      {
        deny: ['/usr/bin/ssh', '/usr/lib/os-release'],
        allow_read: ['~'],
        allow_read_write: [path.join(root, 'opHome/notes')],
      },
      // not /tmp: other tests change it meanwhile
      {deny: ['~/.ssh'], allow_read: ['/var/lib', '/usr/share'], allow_read_write: ['/usr/share/..']},
    ]
    for (const [index, access] of configs.entries()) {
      for (const operatorHome of [os.homedir(), path.join(root, 'opHome')]) {
        for (const namespaces of [false, true]) {
          const policy = compilePolicy({
            fileAccess: {...access, allow_home_dotfiles: index === 2, allow_network: false, best_effort: false},
            workspace: path.join(root, 'gw/agents/me'),
            tmpDir: path.join(root, 'tmp/run'),
            gatewayHome: path.join(root, 'gw'),
            configPath: path.join(root, 'gw/config.yaml'),
            operatorHome,
            otherWorkspaces: [path.join(root, 'gw/agents/other')],
            appRoot: path.join(root, 'app'),
            nodeBinary: process.execPath,
            namespaces,
          })
          const expected = oracleLowerToRules(
            policy.grants,
            policy.denies.filter((deny) => !policy.covered.some((cover) => cover.path === deny.path)),
          )
          expect({index, operatorHome, namespaces, rules: policy.rules, lowered: policy.lowered}).toEqual({
            index,
            operatorHome,
            namespaces,
            ...expected,
          })
          expect(policy.rules.length).toBeGreaterThan(10)
        }
      }
    }
  })
})
