import fs from 'node:fs'
import path from 'node:path'
import {describe, expect, it} from 'vitest'
import {
  processContext,
  runsCgroup,
  sameRunDigest,
  shapesRuns,
} from '../../../../src/runtime/connectors/local-send/protocol.js'
import {RunQueue} from '../../../../src/runtime/gateway/run-queue.js'
import {DOCKER_CLI_ENV_NAMES} from '../../../../src/sandbox/docker/cli.js'
import {ROOT} from '../../../helpers/home.js'

const CONFIG =
  'providers:\n  providers:\n    fake: {kind: openai, api_key_env: MY_KEY, model: m}\nagents:\n  - id: a\n    secrets: [GITHUB_TOKEN]\n'

describe("what must match for the gateway to run send's message", () => {
  it('the config text, every variable the config names or that shapes a run, and the process context; nothing else', () => {
    const env = {MY_KEY: 'k1', GITHUB_TOKEN: 'g1', PATH: '/usr/bin', TERM: 'xterm', SHLVL: '1'}
    const digest = (
      changes: {token?: string; config?: string; env?: Record<string, string | undefined>; context?: string} = {},
    ) =>
      sameRunDigest(
        changes.token ?? 'token',
        changes.config ?? CONFIG,
        {...env, ...changes.env},
        changes.context ?? 'context',
      )
    const same = digest()
    expect(digest({env: {}})).toBe(same)
    // named in the config
    expect(digest({env: {MY_KEY: 'k2'}})).not.toBe(same)
    expect(digest({env: {GITHUB_TOKEN: undefined}})).not.toBe(same)
    // shapes every run
    for (const variable of [
      {PATH: '/opt/bin:/usr/bin'},
      {NODE_EXTRA_CA_CERTS: '/etc/ca.pem'},
      {OPENSSL_CONF: '/etc/ssl/other.cnf'},
      {OPENAI_BASE_URL: 'http://elsewhere'},
      {HTTPS_PROXY: 'http://proxy'},
    ]) {
      expect(digest({env: variable}), JSON.stringify(variable)).not.toBe(same)
    }
    // the ssh agent only when the Docker client uses it
    expect(digest({env: {SSH_AUTH_SOCK: '/tmp/agent.1'}})).toBe(same)
    expect(digest({env: {DOCKER_HOST: 'ssh://host', SSH_AUTH_SOCK: '/tmp/agent.1'}})).not.toBe(
      digest({env: {DOCKER_HOST: 'ssh://host', SSH_AUTH_SOCK: '/tmp/agent.2'}}),
    )
    // the terminal's own, the dashboard's password, debugging
    expect(
      digest({
        env: {
          TERM: 'dumb',
          SHLVL: '2',
          OLDPWD: '/',
          XDG_SESSION_ID: '7',
          MEEPAGATEWAY_PASSWORD: 'pw',
          MEEPAGATEWAY_DEBUG: '1',
        },
      }),
    ).toBe(same)
    // one more space in the file is another file; another process context (a wrapper around send) is another run
    expect(digest({config: `${CONFIG} `})).not.toBe(same)
    expect(digest({context: 'unshare -n'})).not.toBe(same)
    // keyed by the token: without it, the digest tells nothing about the values
    expect(digest({token: 'another'})).not.toBe(same)
    expect(same).toMatch(/^[0-9a-f]{32}$/)
  })

  it('the process context: a child of this process has the same, one in another umask, with other limits or in another network namespace does not', async () => {
    const {execa} = await import('execa')
    const child = (prefix: string, wrapper = '') =>
      execa('sh', [
        '-c',
        `${prefix} exec ${wrapper} node --input-type=module -e "import {processContext} from '${path.join(ROOT, 'dist/runtime/connectors/local-send/protocol.js')}'; process.stdout.write(processContext())"`,
      ])
    const mine = processContext()
    expect((await child('')).stdout).toBe(mine)
    expect((await child('umask 077;')).stdout).not.toBe(mine)
    expect((await child('ulimit -n 200;')).stdout).not.toBe(mine)
    // a network namespace of its own (`unshare -n`, root here as in CI; skipped where it cannot be made)
    const unshared = await execa('unshare', ['-n', 'true'], {reject: false})
    if (unshared.exitCode === 0) expect((await child('', 'unshare -n')).stdout).not.toBe(mine)
  })

  it("the cgroup compared is where runs go: a gateway's own `meepa-gateway` leaf (cgroup v2) is its cgroup's", () => {
    expect(runsCgroup('0::/user.slice/meepa.service/meepa-gateway\n')).toBe(
      runsCgroup('0::/user.slice/meepa.service\n'),
    )
    expect(runsCgroup('0::/user.slice/session-2.scope\n')).not.toBe(runsCgroup('0::/user.slice/meepa.service\n'))
    expect(runsCgroup('12:pids:/a/meepa-gateway-not\n')).toBe('12:pids:/a/meepa-gateway-not\n')
  })

  it('every environment variable the gateway reads either shapes runs or does not change a run of send', () => {
    // the CLI's own output, the dashboard and chat connectors (not a run), and the ssh agent (only
    // under DOCKER_HOST=ssh://)
    const notARun = new Set([
      'CI',
      'DEBUG',
      'FORCE_COLOR',
      'NO_COLOR',
      'OCLIF_COLUMNS',
      'TERM',
      'MEEPAGATEWAY_DEBUG',
      'MEEPAGATEWAY_PASSWORD',
      'SSH_AUTH_SOCK',
      // written, not read: the gateway sets them for its ssh wrapper from the engine's config
      'MEEPA_SSH_CLIENT',
      'MEEPA_SSH_KNOWN_HOSTS',
      'MEEPA_SSH_IDENTITY',
      'MEEPA_SSH_DIAL',
    ])
    const read = new Set<string>(DOCKER_CLI_ENV_NAMES)
    const walk = (dir: string): string[] =>
      fs
        .readdirSync(dir, {withFileTypes: true})
        .flatMap((entry) =>
          entry.isDirectory()
            ? walk(path.join(dir, entry.name))
            : entry.name.endsWith('.ts')
              ? [path.join(dir, entry.name)]
              : [],
        )
    for (const file of walk(path.join(ROOT, 'src'))) {
      for (const match of fs
        .readFileSync(file, 'utf8')
        .matchAll(/\benv(?:\.([A-Z][A-Z0-9_]*)|\[['"]([A-Z][A-Z0-9_]*)['"]\])/g))
        read.add((match[1] ?? match[2]) as string)
    }
    expect(read.size).toBeGreaterThan(10)
    expect([...read].filter((name) => !shapesRuns(name) && !notARun.has(name))).toEqual([])
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
