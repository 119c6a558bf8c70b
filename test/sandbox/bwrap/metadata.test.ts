import {execFileSync} from 'node:child_process'
import {execa} from 'execa'
import fs from 'node:fs'
import os from 'node:os'
import path from 'node:path'
import {afterAll, beforeAll, describe, expect, it} from 'vitest'
import {BIN, makeHome, runCli, type TestHome} from '../../helpers/home.js'
import {requireLandlockOrSkip} from '../../helpers/landlock-support.js'

// Issue: a host-sandboxed run could chmod, chown, touch and setxattr files outside its grants (Landlock
// has no right for them), and under a root gateway make a setuid-root shell for any local user. Each
// operation is attempted here by a sandboxed process, as a root and as an unprivileged gateway, against
// files the run can read but not write; the host then checks that nothing changed.
// the attack names x86_64 system call numbers (utimes, futimesat, fchmodat2) for the calls Python has no wrapper for
const enabled =
  requireLandlockOrSkip('file metadata outside the grants (sandbox exec)') &&
  process.arch === 'x64' &&
  fs.existsSync('/usr/bin/bwrap') &&
  fs.existsSync('/usr/bin/python3')
const asRootToo = process.getuid?.() === 0 && fs.existsSync('/usr/bin/setpriv')

/** Every metadata-changing system call on one path, each reported as `name: OK` or `name: ERRNO`. */
const ATTACK = String.raw`
import ctypes, errno, fcntl, os, struct, sys
libc = ctypes.CDLL(None, use_errno=True)
target = sys.argv[1]
def attempt(name, fn):
    try:
        fn()
        print(name + ": OK")
    except OSError as e:
        print(name + ": " + errno.errorcode.get(e.errno, str(e.errno)))
def raw(nr, *args):
    def call():
        if libc.syscall(nr, *args) != 0:
            raise OSError(ctypes.get_errno(), "")
    return call
st = os.stat(target)
fd = os.open(target, os.O_RDONLY)
dirfd = os.open(os.path.dirname(target), os.O_RDONLY | os.O_DIRECTORY)
name = os.path.basename(target).encode()
attempt("chmod", lambda: os.chmod(target, 0o777))
attempt("fchmod", lambda: os.fchmod(fd, 0o777))
attempt("fchmodat", lambda: os.chmod(name, 0o777, dir_fd=dirfd))
attempt("fchmodat2", raw(452, dirfd, name, 0o777, 0x100))  # AT_SYMLINK_NOFOLLOW
attempt("chown", lambda: os.chown(target, os.getuid(), os.getgid()))
attempt("fchown", lambda: os.fchown(fd, os.getuid(), os.getgid()))
attempt("lchown", lambda: os.lchown(target, os.getuid(), os.getgid()))
attempt("fchownat", lambda: os.chown(name, os.getuid(), os.getgid(), dir_fd=dirfd))
attempt("utimensat", lambda: os.utime(target, (1, 1)))
attempt("futimens", lambda: os.utime(fd, (1, 1)))
attempt("utimes", raw(235, target.encode(), None))
attempt("futimesat", raw(261, dirfd, name, None))
attempt("setxattr", lambda: os.setxattr(target, "user.meepa", b"1"))
attempt("lsetxattr", lambda: os.setxattr(target, "user.meepa", b"1", follow_symlinks=False))
attempt("fsetxattr", lambda: os.setxattr(fd, "user.meepa", b"1"))
attempt("removexattr", lambda: os.removexattr(target, "user.keep"))
attempt("fremovexattr", lambda: os.removexattr(fd, "user.keep"))
def setflags():
    flags = bytearray(8)
    fcntl.ioctl(fd, 0x80086601, flags)  # FS_IOC_GETFLAGS
    value = struct.unpack("l", bytes(flags))[0] | 0x00004000  # FS_NODUMP_FL (no capability needed)
    fcntl.ioctl(fd, 0x40086602, struct.pack("l", value))  # FS_IOC_SETFLAGS
attempt("FS_IOC_SETFLAGS", setflags)
`

/** What a metadata attack must leave unchanged on the host. */
function metadataOf(file: string) {
  const stat = fs.statSync(file)
  return {mode: stat.mode, uid: stat.uid, gid: stat.gid, mtimeMs: stat.mtimeMs, ctimeMs: stat.ctimeMs}
}

async function lsattr(file: string): Promise<string> {
  const result = await execa('lsattr', ['-d', file], {reject: false})
  return result.exitCode === 0 ? String(result.stdout).split(/\s+/)[0]! : `unsupported: ${result.stderr}`
}

interface Gateway {
  label: string
  uid: number
  home: TestHome
  /** A directory outside every grant of the agent but allow_read: the run reads it, may not change it. */
  readOnlyDir: string
  /** The agent's allow_read_write directory. */
  writable: string
  exec(script: string, agent?: string): Promise<{stdout: string; stderr: string; exitCode: number}>
}

function makeGateway(label: string, uid: number): Gateway {
  const readOnlyDir = fs.mkdtempSync(path.join(os.tmpdir(), 'meepa-readonly-'))
  const writable = fs.mkdtempSync(path.join(os.tmpdir(), 'meepa-writable-'))
  const home = makeHome({
    providers: {primary: 'p', providers: {p: {kind: 'openai', model: 'm'}}},
    agents: [
      {id: 'a1', file_access: {allow_read: [readOnlyDir], allow_read_write: [writable]}},
      {id: 'shm', file_access: {allow_read_write: ['/dev/shm']}},
    ],
  })
  const target = path.join(readOnlyDir, 'target.txt')
  fs.writeFileSync(target, 'unchanged\n', {mode: 0o644})
  fs.mkdirSync(path.join(home.home, 'agents', 'a1'), {recursive: true})
  fs.writeFileSync(path.join(home.home, 'agents', 'a1', 'attack.py'), ATTACK)
  fs.writeFileSync(path.join(writable, 'tool.sh'), '#!/bin/sh\necho granted-tool\n', {mode: 0o644})
  if (uid !== 0) {
    for (const dir of [home.home, readOnlyDir, writable]) {
      fs.chmodSync(dir, 0o755)
      for (const entry of [dir, ...fs.readdirSync(dir, {recursive: true}).map((name) => path.join(dir, String(name)))])
        fs.lchownSync(entry, uid, uid)
    }
  }
  // an attribute for the removexattr attempts to remove (Node has no xattr calls)
  execFileSync('/usr/bin/python3', ['-c', 'import os, sys; os.setxattr(sys.argv[1], "user.keep", b"1")', target])
  const exec = async (script: string, agent = 'a1') => {
    const argv = [process.execPath, BIN, 'sandbox', 'exec', '--agent', agent, '--', '/bin/sh', '-c', script]
    const env = {MEEPAGATEWAY_HOME: home.home, HOME: home.home, PATH: '/usr/bin:/bin'}
    const result =
      uid === 0
        ? await execa(argv[0]!, argv.slice(1), {env, reject: false, timeout: 60_000})
        : await execa(
            'setpriv',
            [
              `--reuid=${uid}`,
              `--regid=${uid}`,
              '--clear-groups',
              'env',
              ...Object.entries(env).map(([k, v]) => `${k}=${v}`),
              ...argv,
            ],
            {reject: false, timeout: 60_000},
          )
    return {stdout: String(result.stdout), stderr: String(result.stderr), exitCode: result.exitCode ?? -1}
  }
  return {label, uid, home, readOnlyDir, writable, exec}
}

const gateways: Gateway[] = []
if (enabled) {
  beforeAll(() => {
    gateways.push(makeGateway('an unprivileged gateway (nobody)', 65534))
    if (asRootToo) gateways.push(makeGateway('a root gateway', 0))
  })
  afterAll(() => {
    for (const gateway of gateways) {
      gateway.home.cleanup()
      fs.rmSync(gateway.readOnlyDir, {recursive: true, force: true})
      fs.rmSync(gateway.writable, {recursive: true, force: true})
    }
  })
}

describe.skipIf(!enabled || !asRootToo)(
  'file metadata outside the grants cannot change (sandbox exec)',
  {timeout: 120_000},
  () => {
    const each = (name: string, body: (gateway: Gateway) => Promise<void>) => {
      it(`${name}: an unprivileged gateway`, () => body(gateways[0]!))
      it(`${name}: a root gateway`, () => body(gateways[1]!))
    }

    each(
      'chmod, chown, times, xattrs and attribute flags of a readable file are refused, and the host sees no change',
      async (gateway) => {
        const target = path.join(gateway.readOnlyDir, 'target.txt')
        const before = metadataOf(target)
        const flagsBefore = await lsattr(target)
        const result = await gateway.exec(`/usr/bin/python3 attack.py ${target}`)
        expect(result.exitCode, result.stderr).toBe(0)
        const lines = result.stdout.trim().split('\n')
        expect(lines).toHaveLength(18)
        for (const line of lines) expect(line, gateway.label).toMatch(/: (EROFS|EPERM|EACCES)$/)
        expect(metadataOf(target)).toEqual(before)
        expect(await lsattr(target)).toBe(flagsBefore)
        expect(
          execFileSync('/usr/bin/python3', ['-c', 'import os, sys; print(sorted(os.listxattr(sys.argv[1])))', target], {
            encoding: 'utf8',
          }).trim(),
        ).toBe("['user.keep']")
        expect(fs.readFileSync(target, 'utf8')).toBe('unchanged\n')
      },
    )

    it('a root gateway: system files and the host device nodes keep their mode and times; /dev/null still takes writes', async () => {
      const gateway = gateways[1]!
      const watched = [
        '/etc/hostname',
        '/etc/passwd',
        '/usr/bin/bwrap',
        '/dev/null',
        '/dev/urandom',
        '/dev/tty',
      ].filter((file) => fs.existsSync(file))
      const before = watched.map((file) => metadataOf(file))
      const attacks = watched.flatMap((file) => [
        `chmod 600 ${file}`,
        `touch -d 2001-01-01 ${file}`,
        `chown 1:1 ${file}`,
      ])
      const script =
        attacks.map((attack) => `${attack} 2>/dev/null && echo "CHANGED ${attack}"`).join('; ') +
        '; echo x > /dev/null && echo wrote'
      try {
        const result = await gateway.exec(script)
        expect(result.stdout).not.toContain('CHANGED')
        expect(result.stdout).toContain('wrote')
        expect(watched.map((file) => metadataOf(file))).toEqual(before)
      } finally {
        // a regression must not leave this machine with a mode-600 /dev/null or /etc/passwd
        for (const [index, file] of watched.entries()) {
          fs.chownSync(file, before[index]!.uid, before[index]!.gid)
          fs.chmodSync(file, before[index]!.mode & 0o7777)
        }
      }
    })

    each(
      'no set-user-ID or set-group-ID bit can be set, by chmod, open, mknod or in a writable grant',
      async (gateway) => {
        const script = [
          'cp /bin/sh rootsh',
          'chmod 4755 rootsh 2>/dev/null && echo CHANGED chmod-4755',
          'chmod g+s rootsh 2>/dev/null && echo CHANGED chmod-g+s',
          `/usr/bin/python3 -c "import os; os.open('made', os.O_CREAT | os.O_WRONLY, 0o4755)" 2>/dev/null && echo CHANGED open`,
          `/usr/bin/python3 -c "import os; os.mknod('node', 0o104755)" 2>/dev/null && echo CHANGED mknod`,
          `/usr/bin/python3 -c "import os; fd = os.open('rootsh', os.O_RDONLY); os.fchmod(fd, 0o6755)" 2>/dev/null && echo CHANGED fchmod`,
          'chmod +x rootsh && echo plain-chmod-works',
        ].join('; ')
        const result = await gateway.exec(script)
        expect(result.stdout).not.toContain('CHANGED')
        expect(result.stdout).toContain('plain-chmod-works')
        const workspace = gateway.home.workspace('a1')
        for (const entry of fs.readdirSync(workspace))
          expect(fs.statSync(path.join(workspace, entry)).mode & 0o6000, entry).toBe(0)
      },
    )

    each(
      'inside the grants ordinary metadata changes work: chmod +x and touch in the workspace and an allow_read_write path',
      async (gateway) => {
        const dir = gateway.writable
        const result = await gateway.exec(
          `chmod +x ${dir}/tool.sh && ${dir}/tool.sh && echo mine > mine.sh && chmod 700 mine.sh && touch -d 2001-01-01 mine.sh && echo done`,
        )
        expect(result.stdout, result.stderr).toContain('granted-tool')
        expect(result.stdout).toContain('done')
        expect(fs.statSync(path.join(dir, 'tool.sh')).mode & 0o111).toBe(0o111)
        expect(fs.statSync(path.join(gateway.home.workspace('a1'), 'mine.sh')).mtime.getUTCFullYear()).toBe(2001)
      },
    )

    it("a setuid-root program planted in the workspace gives an unprivileged gateway's run no privilege (nosuid, no_new_privs)", async () => {
      const gateway = gateways[0]!
      const planted = path.join(gateway.home.workspace('a1'), 'planted-id')
      fs.copyFileSync('/usr/bin/id', planted)
      fs.chownSync(planted, 0, 0)
      fs.chmodSync(planted, 0o4755)
      try {
        const result = await gateway.exec('./planted-id -u')
        expect(result.stdout, result.stderr).toBe(String(gateway.uid))
      } finally {
        fs.rmSync(planted)
      }
    })

    each('no new user namespace: unshare -U is refused', async (gateway) => {
      const result = await gateway.exec('unshare -U -r true 2>&1; echo rc=$?')
      expect(result.stdout).toMatch(/Operation not permitted[\s\S]*rc=1/)
    })

    each('a grant under /dev is honoured: allow_read_write /dev/shm writes the host /dev/shm', async (gateway) => {
      const name = `meepa-shm-${process.pid}-${gateway.uid}`
      try {
        const result = await gateway.exec(`echo shared > /dev/shm/${name} && cat /dev/shm/${name}`, 'shm')
        expect(result.stdout, result.stderr).toBe('shared')
        expect(fs.readFileSync(`/dev/shm/${name}`, 'utf8')).toBe('shared\n')
      } finally {
        fs.rmSync(`/dev/shm/${name}`, {force: true})
      }
    })
  },
)

describe.skipIf(!enabled)('sandbox explain names the protection', () => {
  let home: TestHome
  beforeAll(() => {
    home = makeHome({providers: {primary: 'p', providers: {p: {kind: 'openai', model: 'm'}}}, agents: [{id: 'a1'}]})
  })
  afterAll(() => home.cleanup())

  it('with the namespace layer: metadata refused by the read-only mount, setuid bits by seccomp; without it: a gap that refuses the run', async () => {
    const withLayer = await runCli(['sandbox', 'explain', '--agent', 'a1', '--json'], {home: home.home})
    const {report} = JSON.parse(withLayer.stdout) as {
      report: {process: Array<{what: string; mechanism: string}>; enforced: boolean}
    }
    const row = (what: RegExp) => report.process.find((entry) => what.test(entry.what))?.mechanism
    expect(row(/^file metadata outside the writable grants/)).toMatch(/^refused \(read-only file system\)/)
    expect(row(/^set-user-ID/)).toMatch(/seccomp refuses every mode with S_ISUID or S_ISGID.*nosuid,nodev/)
    expect(report.enforced).toBe(true)
    const without = await runCli(['sandbox', 'explain', '--agent', 'a1', '--json'], {
      home: home.home,
      env: {MEEPA_SANDBOX_NO_NAMESPACES: '1'},
    })
    const fallback = (JSON.parse(without.stdout) as {report: {gaps: string[]; enforced: boolean}}).report
    expect(fallback.enforced).toBe(false)
    expect(fallback.gaps.join('\n')).toMatch(/file metadata outside the writable grants .* is not protected/)
  })
})
