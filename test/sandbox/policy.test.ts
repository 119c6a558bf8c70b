import fs from 'node:fs'
import os from 'node:os'
import path from 'node:path'
import {afterEach, beforeEach, describe, expect, it} from 'vitest'
import {READ_RIGHTS, READ_WRITE_RIGHTS, type FsRight} from '../../src/sandbox/landlock/rights.js'
import {
  compilePolicy,
  effectiveRights,
  nodeInstallation,
  type PolicyFileAccess,
  type PolicyInput,
} from '../../src/sandbox/policy.js'

let root: string

beforeEach(() => {
  root = fs.realpathSync(fs.mkdtempSync(path.join(os.tmpdir(), 'meepa-policy-')))
})
afterEach(() => {
  fs.rmSync(root, {recursive: true, force: true})
})

function write(relative: string, content = 'x'): string {
  const file = path.join(root, relative)
  fs.mkdirSync(path.dirname(file), {recursive: true})
  fs.writeFileSync(file, content)
  return file
}

function mkdir(relative: string): string {
  const dir = path.join(root, relative)
  fs.mkdirSync(dir, {recursive: true})
  return dir
}

const NO_ACCESS: PolicyFileAccess = {
  allow_read: [],
  allow_read_write: [],
  deny: [],
  allow_home_dotfiles: false,
  allow_network: true,
  best_effort: false,
}

/** A hermetic layout under `root`: gateway home with two agents, an operator home, the app. */
function layout(fileAccess: Partial<PolicyFileAccess> = {}): PolicyInput {
  write('gw/config.yaml', 'secret: 1')
  write('gw/gateway.db')
  write('gw/agents/me/SOUL.md')
  write('gw/agents/other/SOUL.md')
  write('opHome/.ssh/id_ed25519', 'KEY')
  write('opHome/.bashrc')
  write('opHome/notes/todo.txt')
  write('app/bin/run.js')
  write('node/bin/node')
  mkdir('node/lib/node_modules')
  mkdir('tmp/run')
  mkdir('sys/usr/bin')
  return {
    fileAccess: {...NO_ACCESS, ...fileAccess},
    workspace: path.join(root, 'gw/agents/me'),
    tmpDir: path.join(root, 'tmp/run'),
    gatewayHome: path.join(root, 'gw'),
    configPath: path.join(root, 'gw/config.yaml'),
    operatorHome: path.join(root, 'opHome'),
    otherWorkspaces: [path.join(root, 'gw/agents/other')],
    appRoot: path.join(root, 'app'),
    nodeBinary: path.join(root, 'node/bin/node'),
    systemRead: [path.join(root, 'sys/usr')],
    dnsAndTls: [],
    devices: [],
    etcSecrets: [],
    containerSockets: [],
  }
}

/** Denied: no content, no writes; a listing-only ancestor's read_dir may reach it (a documented limit). */
const expectListingAtMost = (rights: FsRight[]) => expect(rights.filter((right) => right !== 'read_dir')).toEqual([])
const has = (rights: FsRight[], wanted: readonly FsRight[]) => wanted.every((right) => rights.includes(right))
const canRead = (rights: FsRight[]) => rights.includes('read_file')
const canWrite = (rights: FsRight[]) =>
  rights.some((right) =>
    ['write_file', 'make_reg', 'remove_file', 'truncate', 'make_dir', 'remove_dir', 'make_sym', 'refer'].includes(
      right,
    ),
  )

describe('compilePolicy: baseline and mandatory denies', () => {
  it('gives the workspace and temp dir read-write, the app and Node read-only, and nothing else in the gateway home', () => {
    const policy = compilePolicy(layout())
    const at = (relative: string) => effectiveRights(policy.rules, path.join(root, relative))
    expect(has(at('gw/agents/me/SOUL.md'), ['read_file', 'write_file', 'truncate'])).toBe(true)
    expect(has(at('gw/agents/me'), READ_WRITE_RIGHTS)).toBe(true)
    expect(has(at('tmp/run'), READ_WRITE_RIGHTS)).toBe(true)
    expect(at('app/bin/run.js')).toEqual(['execute', 'read_file', 'read_dir'])
    expect(canWrite(at('app/bin/run.js'))).toBe(false)
    expect(at('gw/config.yaml')).toEqual([])
    expect(at('gw/gateway.db')).toEqual([])
    expect(at('gw/agents/other/SOUL.md')).toEqual([])
    expect(at('opHome/.ssh/id_ed25519')).toEqual([])
    expect(at('opHome/notes/todo.txt')).toEqual([])
    expect(at('tmp')).toEqual([])
  })

  it('grants exactly the app root, not its parent', () => {
    write('app-sibling/secret')
    const policy = compilePolicy(layout())
    expect(effectiveRights(policy.rules, path.join(root, 'app-sibling/secret'))).toEqual([])
    expect(policy.rules.some((rule) => rule.path === root)).toBe(false)
  })

  it('grants a private Node install by its prefix and a system Node by its binary only', () => {
    const input = layout()
    expect(nodeInstallation(input.nodeBinary)).toBe(path.join(root, 'node'))
    write('plain/bin/node')
    expect(nodeInstallation(path.join(root, 'plain/bin/node'))).toBe(path.join(root, 'plain/bin/node'))
  })

  it('keeps home dotfiles out even when the whole home is allowed, unless allow_home_dotfiles is set', () => {
    const denied = compilePolicy(layout({allow_read: ['~']}))
    expectListingAtMost(effectiveRights(denied.rules, path.join(root, 'opHome/.ssh/id_ed25519')))
    expectListingAtMost(effectiveRights(denied.rules, path.join(root, 'opHome/.bashrc')))
    expect(canRead(effectiveRights(denied.rules, path.join(root, 'opHome/notes/todo.txt')))).toBe(true)
    // the home itself only keeps its listing: no new entries can be created next to the dotfiles
    expect(effectiveRights(denied.rules, path.join(root, 'opHome'))).toEqual(['read_dir'])

    const allowed = compilePolicy(layout({allow_read: ['~'], allow_home_dotfiles: true}))
    expect(canRead(effectiveRights(allowed.rules, path.join(root, 'opHome/.ssh/id_ed25519')))).toBe(true)
  })

  it('never lets an allow rule reach the gateway config, its state or another agent', () => {
    const policy = compilePolicy(layout({allow_read: [root], allow_read_write: [path.join(root, 'gw')]}))
    const at = (relative: string) => effectiveRights(policy.rules, path.join(root, relative))
    expectListingAtMost(at('gw/config.yaml'))
    expectListingAtMost(at('gw/agents/other/SOUL.md'))
    expect(has(at('gw/agents/me/SOUL.md'), ['read_file', 'write_file'])).toBe(true)
    expect(canRead(at('opHome/notes/todo.txt'))).toBe(true)
    expect(policy.notes.join('\n')).toMatch(/allow_read_write: .*never granted/)
  })

  it('keeps the workspace when the gateway home lives in a dotfile of the operator home', () => {
    const input = layout({allow_read: ['~']})
    write('opHome/.meepagateway/agents/me/SOUL.md')
    const policy = compilePolicy({
      ...input,
      gatewayHome: path.join(root, 'opHome/.meepagateway'),
      workspace: path.join(root, 'opHome/.meepagateway/agents/me'),
    })
    expect(
      has(effectiveRights(policy.rules, path.join(root, 'opHome/.meepagateway/agents/me/SOUL.md')), [
        'read_file',
        'write_file',
      ]),
    ).toBe(true)
    expectListingAtMost(effectiveRights(policy.rules, path.join(root, 'opHome/.ssh/id_ed25519')))
  })
})

describe('compilePolicy: config rules', () => {
  it('lets deny win over allow_read_write and allow_read_write over allow_read', () => {
    write('data/a/file')
    write('data/a/b/file')
    write('data/c/file')
    const policy = compilePolicy(
      layout({
        allow_read: [path.join(root, 'data')],
        allow_read_write: [path.join(root, 'data/a')],
        deny: [path.join(root, 'data/a/b')],
      }),
    )
    const at = (relative: string) => effectiveRights(policy.rules, path.join(root, relative))
    expect(has(at('data/a/file'), ['read_file', 'write_file'])).toBe(true)
    expectListingAtMost(at('data/a/b/file'))
    expect(has(at('data/c/file'), ['execute', 'read_file'])).toBe(true)
    expect(canWrite(at('data/c/file'))).toBe(false)
  })

  // one compile asks the file system about each path once (withPathMemo): the next compile must look again
  it('sees what changed on disk since the last compile: a grant that appeared, a symlink swapped in', () => {
    const input = layout({allow_read: [path.join(root, 'later')]})
    const before = compilePolicy(input)
    expect(before.grants.some((grant) => grant.path === path.join(root, 'later'))).toBe(false)
    write('later/file')
    const after = compilePolicy(input)
    expect(after.grants.some((grant) => grant.path === path.join(root, 'later'))).toBe(true)
    fs.rmSync(path.join(root, 'later'), {recursive: true})
    mkdir('elsewhere')
    fs.symlinkSync(path.join(root, 'elsewhere'), path.join(root, 'later'))
    expect(compilePolicy(input).grants.find((grant) => grant.reason.startsWith('allow_read'))?.path).toBe(
      path.join(root, 'elsewhere'),
    )
  })

  it('expands ~ to the operator home and resolves relative paths against the workspace', () => {
    write('gw/agents/me/notes/n.md')
    const policy = compilePolicy(layout({allow_read: ['~/notes'], deny: ['notes']}))
    expect(canRead(effectiveRights(policy.rules, path.join(root, 'opHome/notes/todo.txt')))).toBe(true)
    expectListingAtMost(effectiveRights(policy.rules, path.join(root, 'gw/agents/me/notes/n.md')))
  })

  it('skips a missing allow path without granting its parent', () => {
    write('data/present')
    const policy = compilePolicy(
      layout({allow_read: [path.join(root, 'data/missing/deeper')], allow_read_write: [path.join(root, 'data/gone')]}),
    )
    expect(effectiveRights(policy.rules, path.join(root, 'data/present'))).toEqual([])
    expect(effectiveRights(policy.rules, path.join(root, 'data'))).toEqual([])
    expect(policy.notes.join('\n')).toMatch(/missing\/deeper: does not exist, not granted/)
  })

  it('lowers a missing deny inside the workspace so the path cannot be created either', () => {
    const policy = compilePolicy(layout({deny: ['secrets/key']}))
    const ws = path.join(root, 'gw/agents/me')
    expect(effectiveRights(policy.rules, ws)).toEqual(['read_dir'])
    expect(effectiveRights(policy.rules, path.join(ws, 'secrets/key'))).toEqual(['read_dir'])
    expect(has(effectiveRights(policy.rules, path.join(ws, 'SOUL.md')), ['read_file', 'write_file'])).toBe(true)
  })

  it('denies a symlink by its target and by the link itself', () => {
    write('data/real-secret', 'S')
    write('data/public')
    fs.symlinkSync(path.join(root, 'data/real-secret'), path.join(root, 'data/link'))
    const policy = compilePolicy(layout({allow_read: [path.join(root, 'data')], deny: [path.join(root, 'data/link')]}))
    expect(policy.denies.map((deny) => deny.path)).toEqual(
      expect.arrayContaining([path.join(root, 'data/real-secret'), path.join(root, 'data/link')]),
    )
    expectListingAtMost(effectiveRights(policy.rules, path.join(root, 'data/real-secret')))
    expect(canRead(effectiveRights(policy.rules, path.join(root, 'data/public')))).toBe(true)
  })

  it('puts no rule on a symlink planted next to a denied path (a rule would land on its target)', () => {
    write('gw/agents/me/private/key')
    fs.symlinkSync(path.join(root, 'opHome/.ssh'), path.join(root, 'gw/agents/me/planted'))
    const policy = compilePolicy(layout({deny: ['private']}))
    expect(policy.rules.some((rule) => rule.path.startsWith(path.join(root, 'opHome')))).toBe(false)
    expectListingAtMost(effectiveRights(policy.rules, path.join(root, 'opHome/.ssh/id_ed25519')))
  })

  it('does not follow a symlink the agent could have planted in its workspace to widen an allow rule', () => {
    const input = layout({allow_read: ['data/notes']})
    fs.symlinkSync(path.join(root, 'opHome'), path.join(root, 'gw/agents/me/data'))
    const policy = compilePolicy(input)
    expect(canRead(effectiveRights(policy.rules, path.join(root, 'opHome/notes/todo.txt')))).toBe(false)
    expect(policy.notes.join('\n')).toMatch(
      /allow_read\[0\] data\/notes: not granted, it goes through the symlink .*data, which the agent can replace/,
    )
  })

  it('refuses a deny that covers the workspace itself', () => {
    expect(() => compilePolicy(layout({deny: [path.join(root, 'gw/agents')]}))).toThrow(/covers the agent workspace/)
  })

  it('refuses paths with a newline, which could smuggle a second rule into the helper', () => {
    expect(() => compilePolicy(layout({allow_read: ['/tmp/a\n/etc']}))).toThrow(/newline/)
  })

  it('turns allow_network into the network mode', () => {
    expect(compilePolicy(layout({allow_network: false})).network).toBe('deny')
    expect(compilePolicy(layout()).network).toBe('allow')
  })

  it('turns allow_listen into the listen mode, off by default', () => {
    expect(compilePolicy(layout()).listen).toBe('deny')
    expect(compilePolicy(layout({allow_listen: true})).listen).toBe('allow')
  })
})

describe('compilePolicy with the namespace layer: covers instead of lowering', () => {
  it('covers an existing denied directory and file inside the workspace; the workspace keeps its full grant', () => {
    write('gw/agents/me/private/key', 'K')
    write('gw/agents/me/token.txt', 'T')
    const ws = path.join(root, 'gw/agents/me')
    const policy = compilePolicy({...layout({deny: ['private', 'token.txt']}), namespaces: true})
    expect(policy.covered).toEqual([
      {path: path.join(ws, 'private'), kind: 'dir', reason: 'deny: private'},
      {path: path.join(ws, 'token.txt'), kind: 'file', reason: 'deny: token.txt'},
    ])
    expect(policy.lowered).toEqual([])
    expect(has(effectiveRights(policy.rules, ws), ['make_reg', 'make_dir', 'remove_file', 'remove_dir', 'refer'])).toBe(
      true,
    )
    // without the layer the same config lowers the workspace root, and says it costs writes
    const fallback = compilePolicy(layout({deny: ['private', 'token.txt']}))
    expect(fallback.covered).toEqual([])
    expect(fallback.lowered).toContainEqual({
      path: ws,
      denied: [path.join(ws, 'private'), path.join(ws, 'token.txt')],
      writable: true,
    })
  })

  it('still lowers for a missing or symlinked denied entry, and never covers a deny with a grant beneath it', () => {
    write('gw/agents/me/real/x')
    fs.symlinkSync(path.join(root, 'gw/agents/me/real'), path.join(root, 'gw/agents/me/link'))
    const ws = path.join(root, 'gw/agents/me')
    const policy = compilePolicy({...layout({deny: ['missing', 'link'], allow_read: [root]}), namespaces: true})
    // MEEPAGATEWAY_HOME lies inside the allow_read grant but holds the workspace: lowered, not covered
    expect(policy.covered.map((cover) => cover.path)).not.toContain(path.join(root, 'gw'))
    expect(policy.lowered.map((dir) => dir.path)).toContain(ws)
    expect(policy.lowered.find((dir) => dir.path === ws)!.denied).toEqual(
      expect.arrayContaining([path.join(ws, 'missing'), path.join(ws, 'link')]),
    )
    // the symlink's target is covered (it is the canonical deny), the link itself is not
    expect(policy.covered.map((cover) => cover.path)).toContain(path.join(ws, 'real'))
    expect(policy.covered.map((cover) => cover.path)).not.toContain(path.join(ws, 'link'))
  })

  it('grants the private devpts only with the layer', () => {
    expect(
      compilePolicy({...layout(), namespaces: true, devices: []}).grants.some((grant) => grant.path === '/dev/pts'),
    ).toBe(true)
    expect(compilePolicy(layout()).grants.some((grant) => grant.path === '/dev/pts')).toBe(false)
  })
})

/** Deterministic PRNG so a failing generated tree can be reproduced from its seed. */
function prng(seed: number): () => number {
  let state = seed >>> 0
  return () => {
    state = (state * 1664525 + 1013904223) >>> 0
    return state / 2 ** 32
  }
}

describe('compilePolicy over generated trees', () => {
  for (const seed of [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12]) {
    it(`matches deny > read-write > read on every path (seed ${seed})`, () => {
      const random = prng(seed)
      const tree = path.join(root, 'tree')
      const dirs: string[] = [tree]
      const files: string[] = []
      fs.mkdirSync(tree)
      for (let index = 0; index < 40; index++) {
        const parent = dirs[Math.floor(random() * dirs.length)]!
        if (path.relative(tree, parent).split(path.sep).length >= 5) continue
        const child = path.join(parent, `${random() < 0.5 ? 'd' : 'e'}${index}`)
        if (random() < 0.55) {
          fs.mkdirSync(child)
          dirs.push(child)
        } else {
          fs.writeFileSync(child, String(index))
          files.push(child)
        }
      }
      const all = [...dirs, ...files]
      const pick = (count: number) => Array.from({length: count}, () => all[Math.floor(random() * all.length)]!)
      const readRoots = [tree, ...pick(1)]
      const writeRoots = pick(3)
      const denies = [...pick(3), path.join(dirs[Math.floor(random() * dirs.length)]!, 'missing-deny')]
      const input = layout({allow_read: readRoots, allow_read_write: writeRoots, deny: denies})
      const policy = compilePolicy(input)

      const under = (target: string, roots: string[]) =>
        roots.some((candidate) => target === candidate || target.startsWith(candidate + path.sep))
      const loweredDirs = new Set(policy.lowered.map((dir) => dir.path))
      for (const target of all) {
        const rights = effectiveRights(policy.rules, target)
        const isDir = dirs.includes(target)
        const context = `${path.relative(tree, target)} seed=${seed} rights=${rights.join(',')}`
        if (under(target, denies)) {
          expect(canRead(rights), context).toBe(false)
          expect(canWrite(rights), context).toBe(false)
          continue
        }
        if (loweredDirs.has(target)) {
          // an ancestor of a denied path keeps its listing and nothing else
          expect(rights, context).toEqual(['read_dir'])
          continue
        }
        const wanted = under(target, writeRoots) ? READ_WRITE_RIGHTS : READ_RIGHTS
        const expected = isDir
          ? wanted
          : wanted.filter((right) => ['execute', 'read_file', 'write_file', 'truncate'].includes(right))
        expect(has(rights, expected), context).toBe(true)
        if (!under(target, writeRoots)) expect(canWrite(rights), context).toBe(false)
      }
    })
  }
})
