import fs from 'node:fs'
import path from 'node:path'
import {describe, expect, it} from 'vitest'
import {sameRunDigest, shapesRuns} from '../../src/runtime/connectors/local-send/protocol.js'
import {RunQueue} from '../../src/runtime/gateway/run-queue.js'
import {DOCKER_CLI_ENV_NAMES} from '../../src/sandbox/docker/cli.js'
import {ROOT} from '../helpers/home.js'

const CONFIG = 'providers:\n  providers:\n    fake: {kind: openai, api_key_env: MY_KEY, model: m}\nagents:\n  - id: a\n    secrets: [GITHUB_TOKEN]\n'

describe("what must match for the gateway to run send's message", () => {
  it('the config text and every variable the config names or that shapes a run; nothing else', () => {
    const env = {MY_KEY: 'k1', GITHUB_TOKEN: 'g1', PATH: '/usr/bin', TERM: 'xterm', SHLVL: '1'}
    const digest = sameRunDigest(CONFIG, env)
    expect(sameRunDigest(CONFIG, {...env})).toBe(digest)
    // named in the config
    expect(sameRunDigest(CONFIG, {...env, MY_KEY: 'k2'})).not.toBe(digest)
    expect(sameRunDigest(CONFIG, {...env, GITHUB_TOKEN: undefined})).not.toBe(digest)
    // shapes every run
    expect(sameRunDigest(CONFIG, {...env, PATH: '/opt/bin:/usr/bin'})).not.toBe(digest)
    expect(sameRunDigest(CONFIG, {...env, NODE_EXTRA_CA_CERTS: '/etc/ca.pem'})).not.toBe(digest)
    expect(sameRunDigest(CONFIG, {...env, OPENAI_BASE_URL: 'http://elsewhere'})).not.toBe(digest)
    // the terminal's own
    expect(sameRunDigest(CONFIG, {...env, TERM: 'dumb', SHLVL: '2', OLDPWD: '/'})).toBe(digest)
    // one more space in the file is another file
    expect(sameRunDigest(`${CONFIG} `, env)).not.toBe(digest)
    expect(digest).toMatch(/^[0-9a-f]{32}$/)
  })

  it('every environment variable the gateway reads either shapes runs or only the output of the CLI', () => {
    const outputOnly = new Set(['CI', 'DEBUG', 'FORCE_COLOR', 'NO_COLOR', 'OCLIF_COLUMNS', 'TERM'])
    const read = new Set<string>(DOCKER_CLI_ENV_NAMES)
    const walk = (dir: string): string[] => fs.readdirSync(dir, {withFileTypes: true}).flatMap((entry) => (entry.isDirectory() ? walk(path.join(dir, entry.name)) : entry.name.endsWith('.ts') ? [path.join(dir, entry.name)] : []))
    for (const file of walk(path.join(ROOT, 'src'))) {
      for (const match of fs.readFileSync(file, 'utf8').matchAll(/\benv(?:\.([A-Z][A-Z0-9_]*)|\[['"]([A-Z][A-Z0-9_]*)['"]\])/g)) read.add((match[1] ?? match[2]) as string)
    }
    expect(read.size).toBeGreaterThan(10)
    expect([...read].filter((name) => !shapesRuns(name) && !outputOnly.has(name))).toEqual([])
  })
})

describe('RunQueue.hasRoom', () => {
  it('says what submit would do: one running and queueLimit waiting per agent', async () => {
    const queue = new RunQueue({maxConcurrent: 2, queueLimit: 1})
    let release!: () => void
    const held = new Promise<void>((resolve) => (release = resolve))
    const job = {run: () => held, cancel: () => {}}
    expect(queue.hasRoom('a')).toBe(true)
    expect(queue.submit('a', job)).toBe(true)
    expect(queue.hasRoom('a')).toBe(true)
    expect(queue.submit('a', job)).toBe(true)
    expect(queue.hasRoom('a')).toBe(false)
    expect(queue.submit('a', job)).toBe(false)
    expect(queue.hasRoom('b')).toBe(true)
    release()
    await queue.idle()
    expect(queue.hasRoom('a')).toBe(true)
  })
})
