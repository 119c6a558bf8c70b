import {execa} from 'execa'
import {spawn, spawnSync, type ChildProcess} from 'node:child_process'
import fs from 'node:fs'
import path from 'node:path'
import {BASE_IMAGE, tempDir} from './docker-env.js'

/**
 * A Docker engine of the test's own (its socket, data root, exec root and pid file in a temp
 * dir), for tests that stop, hang or kill an engine: the shared engine other suites use is never
 * touched. The base image is copied from the shared engine with `docker save | docker load`.
 */
export interface OwnEngine {
  /** Put in DOCKER_HOST. */
  host: string
  /** dockerd's pid (for kill -STOP / -CONT / -KILL). */
  pid: number
  env: Record<string, string>
  docker(args: string[], options?: {timeoutMs?: number}): Promise<{stdout: string; exitCode: number}>
  stop(): void
  resume(): void
  /** SIGKILL of dockerd (an engine that dies); what it leaves is killed by `destroy`. */
  kill(): Promise<void>
  /** Starts the engine again after `kill`, on the same directories (as a service manager would). */
  restart(): Promise<void>
  /** Removes every container, stops the engine and deletes its directories. */
  destroy(): Promise<void>
  /** With `tls: true`: where it also listens (tcp://127.0.0.1:PORT, mutual TLS) and the client's files. */
  tls?: EngineTls
}

/** PEM files made with openssl for one test engine: its CA, a client pair it accepts, and a CA it does not match. */
export interface EngineTls {
  host: string
  ca: string
  cert: string
  key: string
  /** A CA that did not sign the engine's certificate (a client trusting it must refuse the engine). */
  otherCa: string
}

function openssl(args: string[], cwd: string): void {
  const result = spawnSync('openssl', args, {cwd, encoding: 'utf8'})
  if (result.status !== 0) throw new Error(`openssl ${args.join(' ')} failed: ${result.stderr}`)
}

/** A CA, the server's certificate (for 127.0.0.1) and a client certificate, all signed by it; and another CA. */
export function makeCertificates(dir: string): {
  server: {ca: string; cert: string; key: string}
  client: Omit<EngineTls, 'host'>
} {
  fs.mkdirSync(dir, {recursive: true, mode: 0o700})
  // a self-signed CA certificate, or a request for one to sign
  const newKey = (name: string, selfSigned: boolean) =>
    openssl(
      [
        'req',
        ...(selfSigned ? ['-x509', '-days', '2'] : []),
        '-newkey',
        'rsa:2048',
        '-nodes',
        '-subj',
        `/CN=${name}`,
        '-keyout',
        `${name}-key.pem`,
        '-out',
        selfSigned ? `${name}.pem` : `${name}.csr`,
      ],
      dir,
    )
  newKey('ca', true)
  newKey('other-ca', true)
  const signed = (name: string, extensions: string) => {
    newKey(name, false)
    fs.writeFileSync(path.join(dir, `${name}.ext`), extensions)
    openssl(
      [
        'x509',
        '-req',
        '-in',
        `${name}.csr`,
        '-CA',
        'ca.pem',
        '-CAkey',
        'ca-key.pem',
        '-CAcreateserial',
        '-days',
        '2',
        '-extfile',
        `${name}.ext`,
        '-out',
        `${name}.pem`,
      ],
      dir,
    )
  }
  signed('server', 'subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\n')
  signed('client', 'extendedKeyUsage=clientAuth\n')
  const at = (name: string) => path.join(dir, name)
  return {
    server: {ca: at('ca.pem'), cert: at('server.pem'), key: at('server-key.pem')},
    client: {ca: at('ca.pem'), cert: at('client.pem'), key: at('client-key.pem'), otherCa: at('other-ca.pem')},
  }
}

/** overlay2 when the temp dir's filesystem allows it (as scripts/ci/docker-up.sh decides), else vfs. */
function storageDriver(dir: string): string {
  const probe = path.join(dir, 'probe')
  for (const sub of ['lower', 'upper', 'work', 'merged']) fs.mkdirSync(path.join(probe, sub), {recursive: true})
  const mounted = execaSyncOk('mount', [
    '-t',
    'overlay',
    'overlay',
    '-o',
    `lowerdir=${probe}/lower,upperdir=${probe}/upper,workdir=${probe}/work`,
    `${probe}/merged`,
  ])
  if (mounted) execaSyncOk('umount', [`${probe}/merged`])
  fs.rmSync(probe, {recursive: true, force: true})
  return mounted ? 'overlay2' : 'vfs'
}

function execaSyncOk(bin: string, args: string[]): boolean {
  return spawnSync(bin, args, {stdio: 'ignore'}).status === 0
}

export async function startOwnEngine(options: {tls?: boolean; port?: number} = {}): Promise<OwnEngine> {
  // short: the engine's sockets live under it and unix socket paths are limited to 107 bytes
  const dir = tempDir('meng-')
  const host = `unix://${dir}/docker.sock`
  const env = {DOCKER_HOST: host}
  let tls: EngineTls | undefined
  const tlsArgs: string[] = []
  if (options.tls) {
    const made = makeCertificates(path.join(dir, 'certs'))
    tls = {host: `tcp://127.0.0.1:${options.port}`, ...made.client}
    // the test's own calls keep the unix socket; the gateway reaches it over TCP with mutual TLS
    tlsArgs.push(
      '--host',
      tls.host,
      '--tlsverify',
      '--tlscacert',
      made.server.ca,
      '--tlscert',
      made.server.cert,
      '--tlskey',
      made.server.key,
    )
  }
  const args = [
    '--host',
    host,
    ...tlsArgs,
    '--data-root',
    `${dir}/root`,
    '--exec-root',
    `${dir}/exec`,
    '--pidfile',
    `${dir}/pid`,
    '--bridge=none',
    '--iptables=false',
    '--ip-masq=false',
    `--storage-driver=${storageDriver(dir)}`,
  ]
  const docker = async (dockerArgs: string[], options: {timeoutMs?: number} = {}) => {
    const result = await execa('docker', dockerArgs, {env, reject: false, timeout: options.timeoutMs ?? 30_000})
    return {stdout: String(result.stdout), exitCode: result.exitCode ?? -1}
  }
  let daemon: ChildProcess | undefined
  let exited: Promise<void> = Promise.resolve()
  let running = false
  const launch = async () => {
    const log = fs.openSync(path.join(dir, 'dockerd.log'), 'a')
    const started = spawn('dockerd', args, {stdio: ['ignore', log, log], detached: true})
    daemon = started
    exited = new Promise((resolve) => started.once('exit', () => resolve()))
    running = true
    void exited.then(() => (running = false))
    for (let i = 0; ; i++) {
      if ((await docker(['version', '--format', '{{.Server.Version}}'], {timeoutMs: 5000})).exitCode === 0) return
      if (i > 150 || !running)
        throw new Error(
          `the test's own dockerd did not start: ${fs.readFileSync(path.join(dir, 'dockerd.log'), 'utf8').slice(-2000)}`,
        )
      await new Promise((resolve) => setTimeout(resolve, 200))
    }
  }
  const engine: OwnEngine = {
    host,
    tls,
    get pid() {
      return daemon?.pid as number
    },
    env,
    docker,
    stop: () => process.kill(engine.pid, 'SIGSTOP'),
    resume: () => process.kill(engine.pid, 'SIGCONT'),
    kill: async () => {
      process.kill(engine.pid, 'SIGKILL')
      await exited
    },
    restart: async () => {
      // what the killed engine left: its containerd, if it outlived it (it holds the state directory)
      const ps = await execa('ps', ['-eo', 'pid=,args='], {reject: false})
      const left: number[] = []
      for (const line of String(ps.stdout).split('\n')) {
        const match = /^\s*(\d+)\s+((?:\S*\/)?containerd\s.*)$/.exec(line)
        if (match && match[2]?.includes(dir)) left.push(Number(match[1]))
      }
      for (const pid of left) killQuietly(pid)
      for (let i = 0; i < 100 && left.some((pid) => fs.existsSync(`/proc/${pid}`)); i++)
        await new Promise((resolve) => setTimeout(resolve, 50))
      // the pid files too: a new dockerd takes a pid named there for a containerd still running
      for (const file of [`${dir}/pid`, `${dir}/exec/containerd/containerd.pid`]) fs.rmSync(file, {force: true})
      await launch()
    },
    destroy: async () => {
      if (running) {
        process.kill(engine.pid, 'SIGCONT')
        const ids = (await docker(['ps', '-a', '-q'])).stdout.split('\n').filter(Boolean)
        if (ids.length > 0) await docker(['rm', '-f', ...ids])
        process.kill(engine.pid, 'SIGTERM')
        await Promise.race([exited, new Promise((resolve) => setTimeout(resolve, 20_000))])
        if (running) killQuietly(engine.pid)
      }
      // what an engine killed mid-test left: its containers' processes (found by their cgroups,
      // named by the container ids in its own data root), then its shims (started with its paths)
      const ids = fs.existsSync(`${dir}/root/containers`) ? fs.readdirSync(`${dir}/root/containers`) : []
      for (const controller of fs.readdirSync('/sys/fs/cgroup')) {
        for (const id of ids) {
          const procs = `/sys/fs/cgroup/${controller}/docker/${id}/cgroup.procs`
          if (!fs.existsSync(procs)) continue
          for (const pid of fs.readFileSync(procs, 'utf8').split('\n').filter(Boolean)) killQuietly(Number(pid))
        }
      }
      await new Promise((resolve) => setTimeout(resolve, 200))
      for (const controller of fs.readdirSync('/sys/fs/cgroup')) {
        for (const id of ids) {
          try {
            fs.rmdirSync(`/sys/fs/cgroup/${controller}/docker/${id}`) // an empty cgroup is removed with rmdir
          } catch {
            // not there, or still busy
          }
        }
      }
      const ps = await execa('ps', ['-eo', 'pid=,args='], {reject: false})
      for (const line of String(ps.stdout).split('\n')) {
        const match = /^\s*(\d+)\s+(.*)$/.exec(line)
        if (match && match[2]?.includes(dir)) killQuietly(Number(match[1]))
      }
      // dockerd leaves its netns mount behind (and overlay mounts of a killed engine)
      const mounts = fs
        .readFileSync('/proc/self/mounts', 'utf8')
        .split('\n')
        .map((line) => line.split(' ')[1] ?? '')
        .filter((point) => point.startsWith(dir))
      for (const point of mounts.reverse()) await execa('umount', ['-l', point], {reject: false})
      // the gateway's disk images in its volumes stay attached to loop devices (they outlive an engine)
      const images = await execa('find', [dir, '-path', '*/volumes/*', '-name', '*.ext4', '-type', 'f'], {
        reject: false,
      })
      for (const image of String(images.stdout).split('\n').filter(Boolean)) {
        const held = await execa('losetup', ['-j', image, '-n', '-O', 'NAME'], {reject: false})
        for (const device of String(held.stdout).split('\n').filter(Boolean))
          await execa('losetup', ['-d', device.trim()], {reject: false})
      }
      fs.rmSync(dir, {recursive: true, force: true})
    },
  }
  try {
    await launch()
    await execa('sh', ['-c', `docker save ${BASE_IMAGE} | DOCKER_HOST=${host} docker load`])
  } catch (error) {
    await engine.destroy()
    throw error
  }
  return engine
}

/** SIGKILL that ignores a process already gone. */
function killQuietly(pid: number): void {
  try {
    process.kill(pid, 'SIGKILL')
  } catch {
    // exited meanwhile
  }
}
