import fs from 'node:fs'
import path from 'node:path'
import {afterAll, beforeAll, describe, expect, it} from 'vitest'
import {runCli} from '../../helpers/home.js'
import {
  CONFIG_MARKER,
  DB_MARKER,
  DENIED_MARKER,
  OPERATOR_KEY,
  OTHER_MARKER,
  loopbackListeners,
  makeEscapeWorld,
  nodeTcp,
  nodeUdp,
  requireLandlockOrSkip,
  type EscapeWorld,
} from '../../helpers/landlock-support.js'

// Criterion 9 through `meepagateway sandbox exec`: every attack is really attempted by a shell
// inside the sandbox, and the test looks at the outcome on the host (content leaked? file written?).
// EBUSY/EROFS: the namespace layer's read-only covers over denied paths; ESRCH: a host pid does not
// exist in the run's PID namespace
const DENIED =
  /Permission denied|Operation not permitted|EPERM|EACCES|Invalid cross-device link|Device or resource busy|Read-only file system|No such process/
const enabled = requireLandlockOrSkip('host sandbox escape tests (sandbox exec)')

// One world for both suites below (they run one after the other): agents, operator files, listeners.
let world: EscapeWorld
let net: Awaited<ReturnType<typeof loopbackListeners>>
if (enabled) {
  beforeAll(async () => {
    world = makeEscapeWorld('http://127.0.0.1:9/v1')
    net = await loopbackListeners()
  })
  afterAll(() => {
    net.close()
    world.cleanup()
  })
}
const exec = (agent: string, script: string) =>
  runCli(['sandbox', 'exec', '--agent', agent, '--', '/bin/sh', '-c', script], {
    home: world.home,
    env: {HOME: world.operatorHome},
  })

describe.skipIf(!enabled)('sandbox exec: escapes fail', () => {
  /**
   * Runs every attack in one sandboxed shell (one CLI start), each in its own subshell, and checks
   * each one failed with EACCES/EPERM/EXDEV.
   */
  const expectDenied = async (agent: string, attacks: string[], leaked?: string) => {
    const script = attacks
      .map(
        (attack, index) =>
          `out=$( (${attack}) 2>&1 ); echo "ATTACK ${index} rc=$? $(printf %s "$out" | tr '\\n' ' ' | head -c 400)"`,
      )
      .join('\n')
    const result = await exec(agent, script)
    expect(result.exitCode, result.stderr).toBe(0)
    const lines = result.stdout.split('\n').filter((line) => line.startsWith('ATTACK '))
    expect(lines).toHaveLength(attacks.length)
    for (const [index, line] of lines.entries()) {
      expect(line, attacks[index]).not.toMatch(/ rc=0 /)
      expect(line, attacks[index]).toMatch(DENIED)
      if (leaked) expect(line, attacks[index]).not.toContain(leaked)
    }
    return lines
  }

  it("cannot read the operator's planted ~/.ssh/id_ed25519, directly or through a symlink planted in the workspace", async () => {
    fs.symlinkSync(world.key, path.join(world.workspace('open'), 'planted-link'))
    await expectDenied(
      'open',
      [
        `cat ${world.key}`,
        `cat ${path.join(world.operatorHome, 'notes.txt')}`,
        'cat planted-link',
        // a symlink the sandboxed command makes itself leads nowhere either
        `ln -s ${world.key} own-link && cat own-link`,
      ],
      OPERATOR_KEY,
    )
  })

  it('cannot read config.yaml or gateway.db', async () => {
    await expectDenied('open', [`cat ${path.join(world.home, 'config.yaml')}`], CONFIG_MARKER)
    await expectDenied('open', [`cat ${path.join(world.home, 'gateway.db')}`, `ls ${world.home}`], DB_MARKER)
  })

  it("cannot read or write another agent's workspace", async () => {
    const other = world.workspace('other')
    await expectDenied(
      'open',
      [`cat ${other}/notes.txt`, `echo pwned > ${other}/notes.txt`, `echo pwned > ${other}/new.txt`, `ls ${other}`],
      OTHER_MARKER,
    )
    expect(fs.readFileSync(path.join(world.workspace('other'), 'notes.txt'), 'utf8')).toBe(OTHER_MARKER)
    expect(fs.existsSync(path.join(world.workspace('other'), 'new.txt'))).toBe(false)
  })

  it('cannot write outside the workspace and the temp dir', async () => {
    const targets = [
      path.join(world.root, 'outside.txt'),
      path.join(world.home, 'planted.yaml'),
      path.join(world.shared.read, 'readme.txt'),
      '/etc/meepa-escape-test',
      '/tmp/meepa-escape-test',
    ]
    await expectDenied(
      'locked',
      targets.map((target) => `echo pwned > ${target}`),
    )
    for (const target of targets) {
      if (target.endsWith('readme.txt')) expect(fs.readFileSync(target, 'utf8')).toBe('shared read-only data')
      else expect(fs.existsSync(target)).toBe(false)
    }
  })

  it('cannot read, write, rename aside, replace or hard-link a denied path inside the workspace', async () => {
    const ws = world.workspace('locked')
    const secret = path.join(ws, 'private', 'secret.txt')
    await expectDenied(
      'locked',
      [
        'cat private/secret.txt',
        'echo pwned > private/secret.txt',
        'echo pwned > private/new.txt',
        'mv private private-aside',
        'mv private/secret.txt private/moved.txt',
        'mv private/secret.txt work/moved.txt',
        'rm -rf private',
        'rm private/secret.txt',
        'ln -sfn /tmp private',
        'ln -sf /tmp/x private/secret.txt',
        'ln private/secret.txt work/hardlink.txt && cat work/hardlink.txt',
        'ln private/secret.txt "$TMPDIR/hardlink.txt" && cat "$TMPDIR/hardlink.txt"',
        'ln private/secret.txt private/hardlink.txt',
      ],
      DENIED_MARKER,
    )
    expect(fs.readFileSync(secret, 'utf8')).toBe(DENIED_MARKER)
    expect(fs.readdirSync(path.join(ws, 'private'))).toEqual(['secret.txt'])
    expect(fs.existsSync(path.join(ws, 'private-aside'))).toBe(false)
    expect(fs.existsSync(path.join(ws, 'work', 'hardlink.txt'))).toBe(false)
  })

  it('cannot reach a denied path inside an allow_read_write tree', async () => {
    await expectDenied(
      'locked',
      [
        `cat ${world.shared.blocked}/inner.txt`,
        `echo pwned > ${world.shared.blocked}/inner.txt`,
        `mv ${world.shared.blocked} ${world.shared.readWrite}/aside`,
      ],
      DENIED_MARKER,
    )
    expect(fs.readFileSync(path.join(world.shared.blocked, 'inner.txt'), 'utf8')).toBe(DENIED_MARKER)
  })

  it('cannot open TCP or UDP to 127.0.0.1 with allow_network: false', async () => {
    const lines = await expectDenied('locked', [nodeTcp(net.tcpPort), nodeUdp(net.udpPort)])
    expect(lines.join('\n')).not.toMatch(/CONNECTED|SENT/)
    await new Promise((resolve) => setTimeout(resolve, 200))
    expect(net.tcpConnections()).toBe(0)
    expect(net.udpMessages()).toBe(0)
  })

  it('cannot connect to the Docker socket', async () => {
    const socket = ['/var/run/docker.sock', '/run/docker.sock'].find((candidate) => fs.existsSync(candidate))
    if (!socket) return
    await expectDenied('open', [
      `node -e "require('net').connect('${socket}').on('connect',()=>{console.log('CONNECTED');process.exit(0)}).on('error',e=>{console.error(e.message);process.exit(3)})"`,
    ])
  })

  it('finds no provider key in the environment of the command', async () => {
    const result = await exec('open', 'env; cat /proc/self/environ | tr "\\0" "\\n"')
    expect(result.exitCode).toBe(0)
    expect(result.stdout).not.toContain('FAKE_LLM_KEY')
    expect(result.stdout).not.toContain('sk-fake-test-key-123456')
    expect(result.stdout).not.toContain('MEEPAGATEWAY_HOME')
    expect(result.stdout).toContain(`HOME=${world.workspace('open')}`)
  })

  it('cannot signal the gateway process or leave the process group', async () => {
    await expectDenied('open', [`kill -0 ${process.pid}`, 'setsid -w true'])
  })
})

describe.skipIf(!enabled)('sandbox exec: what agents need works', () => {
  it('reads and writes in the workspace and the temp dir', async () => {
    const result = await exec(
      'open',
      'echo hello > made.txt && cat made.txt && mkdir -p sub && mv made.txt sub/ && echo tmp > "$TMPDIR/t" && cat "$TMPDIR/t"',
    )
    expect(result.stderr).toBe('')
    expect(result.stdout).toBe('hello\ntmp')
    expect(fs.readFileSync(path.join(world.workspace('open'), 'sub', 'made.txt'), 'utf8')).toBe('hello\n')
  })

  it('runs /bin/sh and the system tools', async () => {
    const result = await exec(
      'open',
      'ls /usr/bin | grep -c . >/dev/null && echo abc | sed s/b/B/ && node -e "console.log(1+1)"',
    )
    expect(result.stdout).toBe('aBc\n2')
    expect(result.exitCode).toBe(0)
  })

  it('reads allow_read paths and writes allow_read_write paths, and edits files next to a denied entry', async () => {
    // shared-rw and the workspace root hold a denied entry, so they are listing-only: existing
    // files and subdirectories stay writable
    const result = await exec(
      'locked',
      `cat ${path.join(world.shared.read, 'readme.txt')} && echo more >> ${path.join(world.shared.readWrite, 'data.txt')} && echo edited > work/draft.txt && echo created > work/new.txt && cat work/new.txt >/dev/null`,
    )
    expect(result.stderr).toBe('')
    expect(result.stdout).toBe('shared read-only data')
    expect(fs.readFileSync(path.join(world.shared.readWrite, 'data.txt'), 'utf8')).toBe('shared writable data\nmore\n')
    expect(fs.readFileSync(path.join(world.workspace('locked'), 'work', 'draft.txt'), 'utf8')).toBe('edited\n')
  })

  it('reads the DNS and TLS files and reaches 127.0.0.1 when the network is allowed', async () => {
    const bundle = ['/etc/ssl/certs/ca-certificates.crt', '/etc/pki/tls/certs/ca-bundle.crt'].find((file) =>
      fs.existsSync(file),
    )
    const result = await exec(
      'open',
      `cat /etc/resolv.conf >/dev/null && cat /etc/hosts >/dev/null ${bundle ? `&& head -c 10 ${bundle} >/dev/null` : ''} && ${nodeTcp(net.tcpPort)}`,
    )
    expect(result.stderr).toBe('')
    expect(result.stdout).toContain('CONNECTED')
  })

  it('passes the exit status through', async () => {
    expect((await exec('open', 'exit 42')).exitCode).toBe(42)
    expect((await exec('open', 'true')).exitCode).toBe(0)
  })
})
