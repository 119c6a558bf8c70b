import {spawn, spawnSync, type ChildProcess} from 'node:child_process'
import fs from 'node:fs'
import net from 'node:net'
import os from 'node:os'
import path from 'node:path'
import {freePort} from './free-port.js'
import {tempDir} from './docker-env.js'

/**
 * An sshd of the test's own on 127.0.0.1 (its config, a throwaway host key and user key in a temp
 * dir; the system's sshd and ~/.ssh are never touched). A session's `docker` reaches `dockerHost`
 * (sshd's SetEnv), so `ssh://USER@127.0.0.1:PORT` is a Docker engine over ssh; with
 * `containerHost`, its `podman` reaches that service, a Podman engine over ssh.
 */
export interface OwnSshd {
  /** ssh://USER@127.0.0.1:PORT */
  host: string
  /** The user's private key, for engines[].ssh.identity. */
  identity: string
  /** known_hosts holding this sshd's host key. */
  knownHosts: string
  /** known_hosts holding nothing for it (an unknown host). */
  unknownHosts: string
  /** known_hosts holding another key for the same host and port (an impostor, or a reinstalled host). */
  wrongHosts: string
  /** SIGKILL of the listener and of each connection's sshd (open connections drop). */
  kill(): void
  /** Starts it again on the same port and keys. */
  start(): Promise<void>
  destroy(): void
}

function keygen(file: string): string {
  const made = spawnSync('ssh-keygen', ['-q', '-t', 'ed25519', '-N', '', '-f', file], {encoding: 'utf8'})
  if (made.status !== 0) throw new Error(`ssh-keygen failed: ${made.stderr}`)
  // "ssh-ed25519 AAAA… comment" → type and key
  return fs.readFileSync(`${file}.pub`, 'utf8').split(' ').slice(0, 2).join(' ')
}

/**
 * sshd's own processes below `root`: one per connection. Their sessions' programs are left to end
 * on the hangup (killing a login shell mid-start can leave its rc files' locks behind).
 */
function connections(root: number): number[] {
  const children = new Map<number, Array<{pid: number; sshd: boolean}>>()
  const ps = spawnSync('ps', ['-eo', 'pid=,ppid=,args='], {encoding: 'utf8'})
  for (const line of ps.stdout.split('\n')) {
    const match = /^\s*(\d+)\s+(\d+)\s+(.*)$/.exec(line)
    if (!match) continue
    const ppid = Number(match[2])
    children.set(ppid, [...(children.get(ppid) ?? []), {pid: Number(match[1]), sshd: match[3]!.startsWith('sshd')}])
  }
  const found: number[] = []
  const walk = (pid: number) => {
    for (const child of children.get(pid) ?? []) {
      if (!child.sshd) continue
      found.push(child.pid)
      walk(child.pid)
    }
  }
  walk(root)
  return found
}

export async function startOwnSshd(options: {
  dockerHost: string
  /** Podman's far side: `podman system dial-stdio` proxies to this service (its CONTAINER_HOST). */
  containerHost?: string
}): Promise<OwnSshd> {
  const sshd = ['/usr/sbin/sshd', '/usr/local/sbin/sshd'].find((candidate) => fs.existsSync(candidate))
  if (!sshd) throw new Error('sshd is not installed (apt-get install openssh-server; .ci/run installs it)')
  const dir = tempDir('meepa-sshd-')
  const port = await freePort()
  const at = (name: string) => path.join(dir, name)
  const hostKey = keygen(at('host_key'))
  const userKey = keygen(at('user_key'))
  const otherKey = keygen(at('other_host_key'))
  fs.writeFileSync(at('authorized_keys'), `${userKey}\n`)
  fs.writeFileSync(at('known_hosts'), `[127.0.0.1]:${port} ${hostKey}\n`)
  fs.writeFileSync(at('unknown_hosts'), '')
  fs.writeFileSync(at('wrong_hosts'), `[127.0.0.1]:${port} ${otherKey}\n`)
  fs.writeFileSync(
    at('sshd_config'),
    [
      'ListenAddress 127.0.0.1',
      `Port ${port}`,
      `HostKey ${at('host_key')}`,
      `PidFile ${at('sshd.pid')}`,
      `AuthorizedKeysFile ${at('authorized_keys')}`,
      'StrictModes no', // the temp dir's modes are the test's
      'UsePAM no',
      'PasswordAuthentication no',
      'KbdInteractiveAuthentication no',
      'PermitRootLogin prohibit-password',
      'MaxStartups 100',
      // HOME: the session's shell reads no rc file of this machine's user (root's pyenv set-up here
      // made each login ≈ 0.6 s, past the engine watch's deadline on a loaded machine)
      `SetEnv HOME=${dir} DOCKER_HOST=${options.dockerHost} PATH=${process.env.PATH ?? '/usr/local/bin:/usr/bin:/bin'}${options.containerHost ? ` CONTAINER_HOST=${options.containerHost}` : ''}`,
      '',
    ].join('\n'),
  )
  // sshd's privilege separation directory (empty, root's): it refuses to start without it
  fs.mkdirSync('/run/sshd', {recursive: true, mode: 0o755})
  let daemon: ChildProcess | undefined
  const start = async () => {
    daemon = spawn(sshd, ['-D', '-f', at('sshd_config'), '-E', at('sshd.log')], {stdio: 'ignore'})
    for (let i = 0; ; i++) {
      const listening = await new Promise<boolean>((resolve) => {
        const socket = net.connect(port, '127.0.0.1', () => resolve(true)).on('error', () => resolve(false))
        socket.once('connect', () => socket.destroy())
      })
      if (listening) return
      if (i > 100 || daemon.exitCode !== null)
        throw new Error(`the test's sshd did not start: ${fs.readFileSync(at('sshd.log'), 'utf8').slice(-2000)}`)
      await new Promise((resolve) => setTimeout(resolve, 100))
    }
  }
  const kill = () => {
    const pid = daemon?.pid
    if (!pid || daemon?.exitCode !== null) return
    for (const each of [pid, ...connections(pid)]) {
      try {
        process.kill(each, 'SIGKILL')
      } catch {
        // exited meanwhile
      }
    }
  }
  await start()
  return {
    host: `ssh://${os.userInfo().username}@127.0.0.1:${port}`,
    identity: at('user_key'),
    knownHosts: at('known_hosts'),
    unknownHosts: at('unknown_hosts'),
    wrongHosts: at('wrong_hosts'),
    kill,
    start,
    destroy: () => {
      kill()
      fs.rmSync(dir, {recursive: true, force: true})
    },
  }
}
